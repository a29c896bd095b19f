"""Environment code in sandboxed child processes of the generator (``grpo_ray.sandbox``: no network, a root of
read-only folders but a scratch directory, its own processes only, an address-space cap).

A child holds the episodes (environment instances) of the trajectories given to it, by key. ``EnvChild.run``
sends one call and waits ``timeout_s`` for the answer. A call that raises or answers something that is not a
``Step`` fails that episode alone ("error", with the traceback). A call that hangs, exits the child or runs out
of memory ("timeout", "died", "memory") costs the child: it is replaced, and the other episodes it held are gone
with it (``generation`` counts the replacements, so a trajectory knows its episode is lost).
"""

from __future__ import annotations

import dataclasses
import threading

from grpo_ray.data import images
from grpo_ray.sandbox import MEMORY_ERROR, Child, Jail


def env_main(conn, isolation: str, spec: dict) -> None:
    for name, given in (
        spec["sources"].get("preload") or []
    ):  # the environments' code now, not in a first episode's time
        try:
            from grpo_ray.envs import load, options

            options(load(name), given)
        except BaseException:  # SystemExit too: a module that exits as it is imported fails its episodes, not this
            pass  # the episodes' reset says why, each in its trajectory
    conn.send(isolation)
    episodes: dict = {}
    while True:
        try:
            call = conn.recv()
        except EOFError:  # the generator shuts down: every episode still held ends here
            for key in list(episodes):
                close(episodes, key)
            return
        try:
            conn.send(("ok", handle(call, episodes)))
        except MemoryError:
            conn.send(MEMORY_ERROR)
        except Exception as e:  # user code may raise anything: that episode ends, the child goes on
            from grpo_ray import envs
            from grpo_ray.sandbox import failure_text

            close(episodes, call[1])
            conn.send(("error", failure_text(e, (__file__, envs.__file__))))


def close(episodes: dict, key: str) -> None:
    """End the episode `key` (if still held): ``Environment.close``, whose own failure ends nothing else."""
    env = episodes.pop(key, None)
    try:
        if env is not None:
            env.close()
    except Exception:
        pass


def handle(call: tuple, episodes: dict):
    """("reset", key, name, options, row) -> the opening observation or None; ("step", key, turn[, truncated[,
    last]]) -> Step's fields as a dict; ("drop", key) -> None. An episode is closed when it is done, dropped or
    fails."""
    import inspect

    from grpo_ray.envs import Step, load, options

    kind, key = call[0], call[1]
    if kind == "reset":
        _, _, name, given, row = call
        cls = load(name)
        env = cls(options(cls, given))
        episodes[key] = env  # held from here: a reset that raises is closed too
        opening = env.reset(row)
        if opening is not None and not isinstance(opening, str):
            raise TypeError(
                f"reset() returned {type(opening).__name__} {str(opening)[:80]!r}: expected the opening observation's "
                "text or None"
            )
        return opening
    if kind == "drop":
        close(episodes, key)
        return None
    env, cut, last = episodes[key], len(call) > 3 and call[3], len(call) > 4 and call[4]
    takes = inspect.signature(env.step).parameters
    told = {k: True for k, said in (("truncated", cut), ("last", last)) if said and k in takes}
    step = env.step(call[2], **told)
    if isinstance(step, dict):
        step = Step(**step)
    if not isinstance(step, Step):
        raise TypeError(f"step() returned {type(step).__name__} {str(step)[:80]!r}: expected a grpo_ray.envs.Step")
    for name in ("observation", "role"):
        if not isinstance(getattr(step, name), str):
            raise TypeError(f"step() returned a {name} of type {type(getattr(step, name)).__name__}: expected str")
    out = dataclasses.asdict(step)
    out["reward"] = float(out["reward"])
    out["images"] = [images.file_bytes(image) for image in step.images]  # ValueError: one that does not open
    if step.done or cut:
        close(episodes, key)
    return out


class EnvChild(Child):
    """One child process running environment calls, one at a time (a lock: several trajectory threads share it)."""

    main = "grpo_ray.envs.child:env_main"
    grace_s = 5.0
    """Its episodes' ``Environment.close`` runs as its pipe closes (``close``), within this."""

    def __init__(self, jail: Jail, preload: list[tuple[str, dict]] | None = None):
        """`preload`: the environments' (name, options), imported as the child starts (within its 60 s)."""
        self.lock = threading.Lock()
        self.generation = 0
        """How many times the child was replaced: the episodes of an earlier generation are gone."""
        super().__init__(jail, sources={"preload": preload} if preload else None)

    def run(self, call: tuple, timeout_s: float) -> tuple[str, object]:
        """("ok", answer) | ("error", traceback) | ("timeout" | "died" | "memory", None); the child is replaced
        after the last three."""
        with self.lock:
            try:
                self.conn.send(call)
                if not self.conn.poll(timeout_s):
                    outcome = "timeout"
                else:
                    answer = self.conn.recv()
                    if answer != MEMORY_ERROR:
                        return answer
                    outcome = "memory"
            except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
                outcome = "died"
            self.restart()
            self.generation += 1
            return outcome, None
