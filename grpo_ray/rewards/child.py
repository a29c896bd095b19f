"""Reward functions in a sandboxed child process of the reward actor (``grpo_ray.sandbox``), one sample or a batch at
once (``run_many``: the child answers each as it is scored, so a sample costs no round trip of its own). A sample
past ``timeout_s``, one that exits the child or one that runs out of memory costs the child: it is replaced and
the samples after it are sent again."""

from __future__ import annotations

from grpo_ray.sandbox import MEMORY_ERROR, Child, held


def serve(conn, isolation: str, spec: dict) -> None:
    """The child's loop: score each batch it is sent, sample by sample."""
    from grpo_ray.rewards import runner
    from grpo_ray.rewards.runner import score_one

    runner.SOURCES.update(spec["sources"])
    runner.NETWORK["allowed"] = "network" not in held(isolation)
    runner.SHOWN[:] = spec.get("shown") or []
    conn.send(isolation)
    while True:
        try:
            tasks = conn.recv()
        except EOFError:
            return
        for one in tasks:  # a batch (run_many) is answered sample by sample
            try:
                conn.send(score_one(*one))
            except MemoryError:  # past the limit outside the reward function's own try (e.g. sending a huge result)
                conn.send(MEMORY_ERROR)


class RewardChild(Child):
    """One child process scoring samples under a time limit, a memory limit and the sandbox."""

    main = "grpo_ray.rewards.child:serve"

    def run(self, task: tuple, timeout_s: float) -> tuple[str, object]:
        """("ok", result) | ("timeout", None) | ("died", None) | ("memory", None); the child is replaced after
        anything but "ok"."""
        return self.run_many([task], timeout_s)[0]

    def run_many(self, tasks: list[tuple], timeout_s: float) -> list[tuple[str, object]]:
        """``run`` of each of `tasks`, sent at once: each answer is waited for `timeout_s`; after anything but "ok"
        the child is replaced and the tasks after that one are sent again."""
        self._ready()
        out: list[tuple[str, object]] = []
        while len(out) < len(tasks):
            try:
                self.conn.send(tasks[len(out) :])
                while len(out) < len(tasks):
                    if not self.conn.poll(timeout_s):
                        out.append(("timeout", None))
                        break
                    result = self.conn.recv()
                    if result == MEMORY_ERROR or result[2]:
                        out.append(("memory", None))
                        break
                    out.append(("ok", result))
            except (EOFError, BrokenPipeError, ConnectionResetError):
                out.append(("died", None))
            if out[-1][0] != "ok":
                self.restart()
        return out
