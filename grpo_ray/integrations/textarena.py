"""``textarena``: TextArena's games (``pip install 'grpo-ray[envs]'``), the model as player 0, with no glue::

    data.train_files=textarena://GuessTheNumber-v0?size=1000&seed=0
    environment.name=textarena

Rows, ``textarena://GAME?size=N&seed=S``: each row is one game to play, a system message (``INSTRUCTIONS``; the
game's rules and board come as the environment's opening, the prompt's user turn), no ground truth (the game is the
reward), data_source ``textarena/<game>`` and ``extra_info`` ``{env_id, seed}`` (seeds ``S``, ``S+1``, ...: the same
spec gives the same games; validation takes another seed). The game's own arguments are
``environment.options.kwargs``.

A game is made per episode by its id (``options.env``, else the row's ``extra_info.env_id``, which
``textarena://`` rows carry) with ``options.kwargs``, without TextArena's observation wrapper (the model reads each
message once, as the conversation goes on, not the whole history again), and reset with the row's
``extra_info.seed``: the episodes of one group play the same game. Then:

- ``reset``: the other players (``options.num_players`` in all) move until it is the model's turn; what player 0
  has been told by then (the rules, the board) is the episode's opening: the prompt's user turn.
- ``step``: the model's turn is its move, as the game reads it (TicTacToe's ``[4]``); the other players move
  again, and what player 0 was told since (the game's answer, their moves, the board) is the observation. When the
  game ends, player 0's reward is the episode's last (TextArena's: 1 a win, -1 a loss, 0 a draw or a game a
  single player did not finish, the game's own value where it has one).
- The other players are ``options.opponent``: ``random`` (each move drawn among the bracketed moves the player's
  latest message lists, as TicTacToe's and ConnectFour's boards list them, seeded by the row: a group's games
  answer the same moves to the same moves), or ``module:function`` called with the player's observation text and
  its id, returning its move.
"""

from __future__ import annotations

import random
import re
from urllib.parse import parse_qsl

import pydantic

from grpo_ray.envs.base import Environment, Step, import_function, import_trouble

INSTRUCTIONS = "You are playing a text game. Its rules and its state follow; answer with your move as they ask."


def rows(spec: str) -> list[dict]:
    """The rows of a ``textarena://GAME?size=N&seed=S`` spec; ValueError saying what is wrong (the data layer says
    it as the spec's DataError)."""
    game, _, query = spec.removeprefix("textarena://").partition("?")
    game, config = game.strip("/"), dict(parse_qsl(query))
    size, seed = config.pop("size", "1000"), config.pop("seed", "0")
    if config:
        raise ValueError(
            f"unknown key {sorted(config)[0]!r}; expected size and seed (a game's own arguments are "
            "environment.options.kwargs)"
        )
    try:
        size, seed = int(size), int(seed)
    except ValueError as e:
        raise ValueError(f"size and seed are integers ({e})") from None
    if size <= 0 or seed < 0:
        raise ValueError("size must be positive and seed >= 0")
    library()
    known(game)
    return [
        {
            "data_source": f"textarena/{game}",
            "prompt": [{"role": "system", "content": INSTRUCTIONS}],
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": i, "env_id": game, "seed": seed + i},
        }
        for i in range(size)
    ]


MOVE = re.compile(r"\[[^\[\]\n]{1,40}\]")
"""A bracketed move, as TextArena's games write them and read them."""


def library():
    """textarena, or ValueError saying why it does not import."""
    try:
        import textarena
    except ImportError as e:
        raise ValueError(f"the textarena adapter needs textarena: {import_trouble('textarena', e)}") from None
    return textarena


def known(env_id: str) -> None:
    """ValueError unless TextArena has a game `env_id`."""
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        near = sorted(i for i in ENV_REGISTRY if i[:4].lower() == env_id[:4].lower() and i.endswith("-v0"))
        shown = ", ".join(near[:6] or sorted(i for i in ENV_REGISTRY if i.endswith("-v0"))[:6])
        raise ValueError(f"textarena has no game {env_id!r} (some of its {len(ENV_REGISTRY)}: {shown}, ...)")


def text(messages: list, player: int) -> str:
    """What `player` reads of its new messages: the game's as they are, the other players' marked with their id,
    its own moves left out (they are its turns already)."""
    out = []
    for sender, message, *_ in messages:
        if sender == player:
            continue
        out.append(str(message) if sender < 0 else f"[Player {sender}] {message}")
    return "\n\n".join(m.strip() for m in out if str(m).strip())


class TextArena(Environment):
    @classmethod
    def imports(cls, options: dict) -> list[str]:
        return [options.get("opponent") or ""]

    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")

        env: str = ""
        """The game's id (``TicTacToe-v0``); empty: each row's ``extra_info.env_id``."""
        kwargs: dict = {}
        """The game's own arguments (beside those its id registers)."""
        num_players: int = pydantic.Field(1, ge=1)
        """Players in a game: the model is player 0, ``opponent`` the others."""
        opponent: str = "random"
        """``random`` or ``module:function`` (``function(observation, player) -> move``)."""

        @pydantic.model_validator(mode="after")
        def _known(self):
            library()
            if self.env:
                known(self.env)
            if self.opponent != "random":
                opponent_function(self.opponent)
            return self

    def reset(self, row: dict) -> str:
        ta = library()
        info = row.get("extra_info") or {}
        env_id = self.options.env or info.get("env_id") or ""
        if not env_id:
            raise ValueError("no game: environment.options.env, or the row's extra_info.env_id (textarena:// rows)")
        known(env_id)
        env = ta.make(env_id, **self.options.kwargs)
        while isinstance(env, ta.core.Wrapper):  # the game itself: its messages as they come, not the history
            env = env.env
        seed = int(info.get("seed", 0))
        self.env, self.rng = env, random.Random(seed)
        self.opponent = (
            self.random_move if self.options.opponent == "random" else opponent_function(self.options.opponent)
        )
        env.reset(num_players=self.options.num_players, seed=seed)
        told, _ = self.until_ours()
        return told

    def step(self, turn: str) -> Step:
        done, _ = self.env.step(action=turn)
        told = ""
        if not done:
            told, done = self.until_ours()
        if not done:
            return Step(told)
        rewards, _ = self.env.close()
        return Step(told, reward=float((rewards or {}).get(0, 0.0)), done=True)

    def until_ours(self) -> tuple[str, bool]:
        """The other players move until it is player 0's turn: what player 0 was told, and whether the game
        ended."""
        while True:
            player, messages = self.env.get_observation()
            if player == 0:
                return text(messages, 0), False
            done, _ = self.env.step(action=str(self.opponent(text(messages, player), player)))
            if done:
                return "", True

    def random_move(self, observation: str, player: int) -> str:
        """A move drawn among the bracketed ones of the latest paragraph that lists any (a board's moves)."""
        for paragraph in reversed(observation.split("\n\n")):
            moves = MOVE.findall(paragraph)
            if moves:
                return self.rng.choice(moves)
        return "[0]"


def opponent_function(name: str):
    """The function `name` (``module:function``) names; ValueError saying why not."""
    try:
        return import_function(name)
    except ValueError as e:
        raise ValueError(f"opponent={name!r}: {e}") from None
