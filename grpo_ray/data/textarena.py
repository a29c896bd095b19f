"""TextArena's games as data, with no glue (``pip install 'grpo-ray[envs]'``): ``textarena://GAME?size=N&seed=S``.

Each row is one game to play: a system message (the game's rules and board come as the environment's opening, the
prompt's user turn: ``grpo_ray.envs.textarena_env``), no ground truth (the game is the reward), data_source
``textarena/<game>`` and ``extra_info`` ``{env_id, seed}`` (seeds ``S``, ``S+1``, ...: the same spec gives the same
games; validation takes another seed). The game's own arguments are ``environment.options.kwargs``.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

INSTRUCTIONS = "You are playing a text game. Its rules and its state follow; answer with your move as they ask."


def rows(spec: str) -> list[dict]:
    """The rows of a ``textarena://GAME?size=N&seed=S`` spec; ValueError saying what is wrong (the data layer says
    it as the spec's DataError)."""
    from grpo_ray.envs.textarena_env import known, library

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
