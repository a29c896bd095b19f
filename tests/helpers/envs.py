"""Environments that misbehave, for the containment tests, and one that counts turns (the tests' own)."""

import os
import time

from grpo_ray.envs import Environment, Step


class Echo(Environment):
    """Answers each turn with its turn number; done after `stop` turns (never, at 0)."""

    def reset(self, row):
        self.turns = 0

    def step(self, turn):
        self.turns += 1
        return Step(f"turn {self.turns}", reward=0.25)


class Raise(Echo):
    def step(self, turn):
        raise ValueError("the tool broke")


class Hang(Echo):
    def step(self, turn):
        time.sleep(3600)


class Exit(Echo):
    def step(self, turn):
        os._exit(3)


class Flood(Echo):
    def step(self, turn):
        return Step("x" * 1_000_000)


class Garbage(Echo):
    def step(self, turn):
        return 42


class Sleepy(Echo):
    """A tool that takes 50 ms a call (the latency benchmark's)."""

    def step(self, turn):
        time.sleep(0.05)
        return super().step(turn)


class Slow(Echo):
    """A tool that takes 0.5 s a call; a turn "held?" answers how many episodes its process holds (reset, not yet
    closed)."""

    held = 0

    def reset(self, row):
        Slow.held += 1
        super().reset(row)

    def step(self, turn):
        if turn == "held?":
            return Step(str(Slow.held))
        time.sleep(0.5)
        return super().step(turn)

    def close(self):
        Slow.held -= 1


class Probe(Echo):
    """Tries to write the file named by the turn and to open a connection: says what happened."""

    def step(self, turn):
        import socket

        try:
            with open(turn, "w") as f:
                f.write("x")
            wrote = "wrote"
        except OSError as e:
            wrote = type(e).__name__
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=1).close()
            net = "connected"
        except OSError as e:
            net = type(e).__name__
        return Step(f"{wrote} {net}")


class NoStep(Environment):
    """Forgets to write step: refused before start."""

    def reset(self, row):
        self.turns = 0


class Closing(Echo):
    """Keeps the names (ground truths) of the episodes its process closed; a turn "closed?" answers them. Done at
    "done", raises at "raise" (and in reset for "bad"); says whether a turn came cut or last. Closing an episode
    whose row has extra_info.mark writes that file (a process without the sandbox: the test sees its shutdown)."""

    closed: list[str] = []

    def reset(self, row):
        self.name, self.mark = row.get("ground_truth", ""), (row.get("extra_info") or {}).get("mark")
        if self.name == "bad":
            raise ValueError("no such game")

    def step(self, turn, truncated=False, last=False):
        if turn == "raise":
            raise ValueError("the game broke")
        if turn == "closed?":
            return Step(" ".join(Closing.closed))
        return Step(f"{turn} truncated={truncated} last={last}", done=turn == "done")

    def close(self):
        Closing.closed.append(self.name)
        if self.mark:
            with open(self.mark, "w") as f:
                f.write(self.name)


class Opening(Echo):
    """An env-first game: its task is its opening observation (drawn from the row's seed, alike in a group)."""

    def reset(self, row):
        super().reset(row)
        return f"Guess my number, seed {(row.get('extra_info') or {}).get('seed', 0)}."


class Drifting(Echo):
    """Opens each episode with a task of its own drawing, not the row's: its groups cannot share one prompt."""

    def reset(self, row):
        import random

        super().reset(row)
        return f"Guess my number, seed {random.random()}."


class NotText(Echo):
    def reset(self, row):
        return {"board": "x.o"}


class AsUser(Echo):
    """Echo whose observations are written as the user's messages, whatever environment.role says; 1.0 the first
    turn, 0.5 the next ones (rewards kept at their turn)."""

    def step(self, turn):
        self.turns += 1
        return Step(f"turn {self.turns}", reward=1.0 if self.turns == 1 else 0.5, role="user")


class ShowPicture(Environment):
    """Shows a picture after the model's first turn (``Step.images``: a vision-language model reads it before its
    second), one of random colours drawn from the turn's text; the episode's reward is the second turn's length, odd
    or even."""

    def reset(self, row):
        self.turns = 0

    def step(self, turn):
        import random

        from PIL import Image

        self.turns += 1
        if self.turns == 1:
            g = random.Random(turn)
            picture = Image.frombytes("RGB", (40, 30), bytes(g.randrange(256) for _ in range(40 * 30 * 3)))
            return Step("And this one?", images=[picture])
        return Step(done=True, reward=float(len(turn) % 2))
