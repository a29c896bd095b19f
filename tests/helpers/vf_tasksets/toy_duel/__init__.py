"""A verifiers v1 taskset whose environment seats two agents, both the run's model (neither pinned to another): one
says a word, the other says it back. One recorded conversation an episode cannot hold both, so the adapter refuses
it before start."""

import verifiers.v1 as vf


class DuelTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    pass


class Duel(vf.Taskset[DuelTask, vf.TasksetConfig]):
    def load(self):
        yield DuelTask(vf.TaskData(prompt="Say a word."), self.config.task)


class DuelEnvConfig(vf.EnvConfig):
    speaker: vf.AgentConfig = vf.AgentConfig()
    echo: vf.AgentConfig = vf.AgentConfig()


class DuelEnv(vf.Env[DuelEnvConfig]):
    async def run(self, task, agents):
        said = await agents.speaker.run(task)
        await agents.echo.run(DuelTask(vf.TaskData(prompt=f"Say back: {said.root_reply}"), task.config))


__all__ = ["Duel", "DuelEnv"]
