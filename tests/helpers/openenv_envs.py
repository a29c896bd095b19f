"""OpenEnv environments written against the library (openenv-core): one on its MCP base class with a FastMCP
tool, the way OpenEnv environments offer tools, and a plain one. Run through grpo_ray's ``openenv`` adapter in
tests/test_envs.py."""

from fastmcp import FastMCP
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Action, Observation, State


class Multiply(MCPEnvironment):
    """One tool, ``multiply(a, b)`` (a * b * scale + the episode's offset); any action other than a tool call ends
    the episode with reward 1."""

    def __init__(self, scale: int = 1):
        mcp = FastMCP("multiply")

        @mcp.tool()
        def multiply(a: int, b: int) -> int:
            return a * b * scale + self.offset

        super().__init__(mcp)
        self._state, self.offset = State(episode_id="0", step_count=0), 0

    def reset(self, seed=None, episode_id=None, offset: int = 0):
        self._state, self.offset = State(episode_id=episode_id or "0", step_count=0), offset
        return Observation(done=False, reward=0.0)

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=True, reward=1.0)

    @property
    def state(self):
        return self._state


class Say(Action):
    text: str


class Told(Observation):
    text: str = ""


class Count(Environment):
    """tests/helpers/envs.py's Echo written for OpenEnv: answers each turn with its number, never done; 0.25 a turn and
    0.01 a character of it (every turn is stepped, a cut one too: the characters tell trajectories apart)."""

    def __init__(self):
        super().__init__()
        self._state = State(episode_id="0", step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> Told:
        self._state = State(episode_id=episode_id or "0", step_count=0)
        return Told(done=False, reward=0.0)

    def step(self, action: Say, timeout_s=None, **kwargs) -> Told:
        self._state.step_count += 1
        return Told(text=f"turn {self._state.step_count}", done=False, reward=0.25 + 0.01 * len(action.text))

    @property
    def state(self):
        return self._state
