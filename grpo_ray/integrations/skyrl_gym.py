"""``skyrl_gym``: an environment of skyrl-gym (SkyRL's gymnasium-shaped text environments), run as one of ours with
no glue (``pip install 'grpo-ray[envs]'``)::

    environment: {name: skyrl_gym, options: {env: gsm8k_multi_turn}}

A skyrl-gym environment is made per episode by ``skyrl_gym.make(env, env_config=options.env_config, extras=...)``,
its extras built from the data row as SkyRL's own datasets have them: ``reward_spec`` (``method: rule`` and the
row's ground truth), the row's ``extra_info``, and ``options.extras`` beside them. Then:

- ``reset``: the environment's ``init`` is given the row's prompt messages; an environment that answers another
  prompt (one that rewrites it) is refused with the two shown: the prompt here comes from the data row.
- ``step``: the model's turn is the environment's action; the messages of its observation are answered as one
  message (their texts joined by a blank line) in their own role (``environment.role`` where they have none or
  several), its reward is the turn's and ``done`` ends the episode.
- ``close``: the environment's ``close``.

Its own environments (``gsm8k``, ``gsm8k_multi_turn``, ``aime``, ``lcb``, ``text2sql``, ``search``, ...) and any
registered with ``skyrl_gym.register`` by a module named in ``options.imports`` are found by id.
"""

from __future__ import annotations

import importlib
import typing

import pydantic

from grpo_ray.envs.base import Environment, Step, import_trouble


class SkyRLGym(Environment):
    class Options(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")

        env: str
        """The environment's id in skyrl-gym's registry (``gsm8k_multi_turn``)."""
        env_config: dict[str, typing.Any] = {}
        """Its ``env_config``."""
        extras: dict[str, typing.Any] = {}
        """More of its ``extras`` (``max_turns``, ...), beside those made from the row."""
        imports: list[str] = []
        """Modules that register environments of your own (imported before the id is looked up)."""

        @pydantic.model_validator(mode="after")
        def _known(self):
            try:
                import skyrl_gym
            except ImportError as e:
                raise ValueError(f"the skyrl_gym adapter needs skyrl-gym: {import_trouble('skyrl-gym', e)}") from None
            for name in self.imports:
                importlib.import_module(name)
            ids = sorted(skyrl_gym.registry)
            if self.env not in ids:
                raise ValueError(f"env={self.env!r}: skyrl-gym has no such environment (it has {', '.join(ids)})")
            return self

    def reset(self, row: dict) -> None:
        import skyrl_gym

        truth = row.get("ground_truth")
        extras = {
            "reward_spec": {"method": "rule", "ground_truth": truth},
            "extra_info": row.get("extra_info") or {},
            **self.options.extras,
        }
        self.env = skyrl_gym.make(self.options.env, env_config=dict(self.options.env_config), extras=extras)
        prompt = row.get("messages") or []
        given, _ = self.env.init(prompt)
        if prompt and given != prompt:
            raise ValueError(
                f"skyrl-gym's {self.options.env} rewrites the prompt ({given!r} for {prompt!r}); the prompt comes "
                "from the data row here"
            )

    def step(self, turn: str) -> Step:
        out = self.env.step(turn)
        said = out.get("observations") or []
        text = "\n\n".join(m.get("content", "") for m in said)
        roles = {m.get("role") or "" for m in said}
        role = roles.pop() if len(roles) == 1 else ""
        return Step(text, reward=float(out.get("reward") or 0.0), done=bool(out.get("done")), role=role)

    def close(self) -> None:
        if getattr(self, "env", None) is not None:
            self.env.close()
