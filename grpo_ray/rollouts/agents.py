"""Agent programs' trajectories on one engine (``environment.name: agent``): each trajectory is one run of the
program (``grpo_ray.envs.agent``) in an agent process, its calls answered by the generator's endpoint
(``grpo_ray.rollouts.endpoint``) and recorded token in, token out.

A group's programs run at once, each in its session. When all have ended, the group's prompt is their first call's
(the programs of a group must open alike: a group answers one prompt; where they differ the group's trajectories end
as errors, said), and each trajectory is what its session recorded after it, with the program's return value as its
reward. A trajectory with no token (a program that failed before its first call, or never called) gets one turn
generated from the group's prompt, as a failed reset does, and is counted.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from functools import partial
from pathlib import Path

from grpo_ray.algo.advantage import turn_spans
from grpo_ray.envs import jail, load, options
from grpo_ray.envs.agent import prepared
from grpo_ray.envs.agent_child import AgentChild
from grpo_ray.models import vision
from grpo_ray.rollouts.endpoint import Endpoint, Session, as_sent, templated
from grpo_ray.rollouts.trajectory import Trajectory
from grpo_ray.types import Prompt

FAILED = {
    "timeout": "ran past environment.options.timeout_s",
    "died": "exited, or lost its process (another episode in it ran past its time, exited or ran out of memory)",
    "memory": "ran out of memory (environment.memory_mb)",
}


class AgentRuns:
    """The endpoint and agent processes of one generator; runs groups for ``grpo_ray.rollouts.episodes.Episodes``."""

    def __init__(self, episodes):
        self.episodes, e = episodes, episodes.env
        self.options = options(load(e.name), e.options)
        self.dir = tempfile.mkdtemp(prefix="grpo-agent-")
        path = str(Path(self.dir) / "endpoint.sock")
        self.endpoint = Endpoint(episodes, path)
        shown, self.kwargs = prepared(self.options.program, self.options.kwargs)
        sandbox = jail(episodes.recipe)
        sandbox.paths = [*sandbox.paths, *shown]
        self.children = [AgentChild(sandbox, path, self.options.program) for _ in range(e.workers)]

    def start(self, prompt: Prompt, n: int, seed: int, sampling, loop, lora=lambda: None) -> Future:
        """Run `n` programs on `prompt`'s row; the future gives their trajectories (prompt index 0), `prompt`
        rewritten in place to their first call's. Cancelling it (a notice's hand-back, ``Looping.hand_back``; from
        any thread but the loop's) closes their sessions and aborts their calls in the engine: each program's call
        is refused from then on (404), and nothing of its run is recorded."""
        ep, o = self.episodes, self.options
        key, group, lock, left = next(ep.keys), Future(), threading.Lock(), [n]
        ts = [Trajectory(0, seed, f"{key}/{j}", None) for j in range(n)]
        sessions = [Session(t.key, loop, lora, sampling, seed, ep.env.max_tokens) for t in ts]

        started = time.perf_counter()

        def ended(t, s: Session, future: Future) -> None:
            if group.cancelled():  # handed back: its session is closed, its run not recorded
                return
            try:
                t.episode.seconds = time.perf_counter() - started - s.model_seconds  # the program's own time
                self._record(t, s, *future.result())
                with lock:
                    left[0] -= 1
                    if left[0]:
                        return
                self._finish(prompt, ts, sessions, group, loop, lora, sampling)
            except BaseException as e:  # a failure here fails the group (the caller's result raises it)
                if not group.done():
                    group.set_exception(e)

        def stopped(future: Future) -> None:
            if future.cancelled():
                for s in sessions:
                    self.endpoint.close(s.key)
                loop.abort([s.sent for s in sessions if s.sent is not None])

        group.add_done_callback(stopped)
        row = prompt.env_row()
        if prompt.images:  # an image row's pictures as the program would send them (image_url parts)
            row["messages"] = as_sent(prompt.messages, prompt.images)
        for j, (t, s) in enumerate(zip(ts, sessions)):
            self.endpoint.open(s)
            child = self.children[(key * n + j) % len(self.children)]
            child.start(t.key, o.program, self.kwargs, row, o.timeout_s).add_done_callback(partial(ended, t, s))
        return group

    def _record(self, t, s: Session, outcome: str, value) -> None:
        """Trajectory `t` from its session `s` and how its program ended."""
        self.endpoint.close(t.key)
        e = t.episode
        t.ids, t.mask, t.logprobs, t.versions, t.texts = s.ids, s.mask, s.logprobs, s.versions, s.texts
        t.given, t.images, t.extra, t.turns_at, t.context = s.given, s.images[s.given :], s.extra, s.turns_at, s.context
        e.turns, e.off_record, e.ended = list(s.texts), s.off_record, s.ended or ("length" if s.cut else "done")
        if e.ended in ("length", "tokens"):  # its last reply cut, or its token budget spent: a cut end, as a cut
            t.finish_reason = "length"  # turn's in an environment's episode
        if outcome == "ok":
            e.reward, e.rewards = value, [*[0.0] * (len(turn_spans(s.mask)) - 1), value]  # at its last call
            if not s.ids:
                self.episodes._failed(t, "error", "the program called the model 0 times")
        else:
            self.episodes._failed(t, outcome, value if outcome == "error" else f"the program {FAILED[outcome]}")

    def _finish(self, prompt: Prompt, ts: list, sessions: list[Session], group: Future, loop, lora, sampling) -> None:
        """The group's prompt from its programs' first calls; a turn for each trajectory with no token; then the
        group's result."""
        opened = {(tuple(s.prompt), tuple(s.images[: s.given])) for s in sessions if s.ids}
        if len(opened) > 1:
            for t in ts:
                self.episodes._failed(
                    t, "error", "the group's programs opened with different prompts: a group answers one"
                )
                t.ids, t.mask, t.logprobs, t.versions = [], [], [], []
                t.images, t.extra, t.turns_at, t.context = [], 0, [], None  # (a turn from the row's prompt below)
        elif opened:
            first = next(s for s in sessions if s.ids)
            prompt.ids, prompt.images = list(first.prompt), first.images[: first.given]
            prompt.messages = templated(first.opened)
            prompt.text = self.episodes.tokenizer.decode(first.prompt)
        empty = [t for t in ts if not t.ids]
        if not empty:
            group.set_result([t.completion() for t in ts])
            return
        left, lock = [len(empty)], threading.Lock()

        def generated(t, future: Future) -> None:
            try:  # (a failure in a callback would be lost: the group's, its caller's result raises it)
                self.episodes._add_turn(t, future.result(), bool(self.episodes.banned))
                with lock:
                    left[0] -= 1
                    if left[0]:
                        return
                group.set_result([t.completion() for t in ts])
            except BaseException as e:
                if not group.done():
                    group.set_exception(e)

        for t in empty:
            params = self.episodes._turn_params(t, 0, sampling, self.episodes.env.max_tokens)
            request = {"prompt_token_ids": prompt.ids}
            if prompt.images:
                request["multi_modal_data"] = {"image": vision.decoded(prompt.images)}
            sent = loop.submit(request, params, lora(), f"{t.key}/0")
            sent.add_done_callback(partial(generated, t))

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)  # first: the rest may take its children's grace
        for c in self.children:
            c.close()
        self.endpoint.shutdown()
