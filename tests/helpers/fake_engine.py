"""An engine without a model, for tests/test_sources.py's Ray actors: in a module of its own that imports only
``grpo_ray.types``, so each actor's worker starts without torch (a worker imports the module that defines its
class: the test module's imports cost each actor 2 s here)."""

from grpo_ray.types import Completion, Rollout, RolloutStats


class FakeGenerator:
    """An engine without a model: a group is its prompt's uid as tokens; streaming, a group sent finishes at the next
    take, a long one (a prompt with uid % 3 == 0) at the take after, so the short groups sent after it are taken
    first, as the first groups to finish are."""

    def __init__(self, version: int = 0):
        self.version, self.groups, self.generated, self.submitted = version, [], 0, 0

    def generate(self, prompts, n, seeds, sampling=None):
        self.generated += 1
        return self._answer(prompts, n)

    def calls(self):
        return self.generated

    def submit(self, prompts, n, seeds):
        self.groups += [[p, n, 0] for p in prompts]
        self.submitted += len(prompts)

    def sent(self):
        return self.submitted

    def take(self, n, oldest_kept, sends=0):
        if len(self.groups) < n:
            raise RuntimeError(f"asked for {n} groups, and {len(self.groups)} was all this engine held")
        for g in self.groups:
            g[2] += 1  # takes seen
        done = [g for g in self.groups if g[2] > (g[0].uid % 3 == 0)]
        taken = (done + [g for g in self.groups if g not in done])[:n]  # the first to finish, else waited for
        self.groups = [g for g in self.groups if g not in taken]
        return self._answer([p for p, _, _ in taken], taken[0][1] if taken else 1)

    def hand_back(self):
        """The groups not finished (a long one before its second take, a short one before its first), dropped."""
        going = [g for g in self.groups if g[2] <= (g[0].uid % 3 == 0)]
        self.groups = [g for g in self.groups if g not in going]
        return [p.uid for p, _, _ in going]

    def load(self, version):
        self.version = version

    def close(self):
        pass

    def _answer(self, prompts, n):
        completions = [
            Completion(j, [p.uid] * (2 + p.uid % 3), "", [-1.0] * (2 + p.uid % 3), "stop", versions=None)
            for j, p in enumerate(prompts)
            for _ in range(n)
        ]
        lengths = [len(c.token_ids) for c in completions]
        stats = RolloutStats(0.01, self.version, [1] * len(prompts), lengths, 0, uids=[p.uid for p in prompts])
        return Rollout(prompts, completions, self.version), stats
