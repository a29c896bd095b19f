"""A verifiers v1 taskset with an environment of its own, written as verifiers' multi-turn environments are (its
TextArena env the model): the env is the run's user, driving one seat turn by turn through ``interaction.turn()``.
Each task names a word; the player says it, the env answers ``Again: say <word>.`` and the player says it again,
``rounds`` replies in all (a configuration key, 3 by default); the reward, recorded on the trace by the env, is the
mean over the replies of the share of the word's letters each holds."""

import verifiers.v1 as vf

WORDS = ["pear", "plum", "fig", "lime", "kiwi", "date", "sloe", "yuzu"]


def share(word: str, reply: str) -> float:
    return len(set(word) & set(reply)) / len(set(word))


class RoundsData(vf.TaskData):
    word: str


class RoundsTask(vf.Task[RoundsData, vf.State, vf.TaskConfig]):
    pass


class RoundsConfig(vf.TasksetConfig):
    rounds: int = 3


class Rounds(vf.Taskset[RoundsTask, RoundsConfig]):
    def load(self):
        for word in WORDS:
            yield RoundsTask(
                RoundsData(prompt=f"Say {word}.", system_prompt="Answer in one word.", word=word), self.config.task
            )


class RoundsEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class RoundsEnv(vf.Env[RoundsEnvConfig]):
    async def run(self, task, agents):
        word, scores = task.data.word, []
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                scores.append(share(word, segment.last_reply))
                if len(scores) == self.taskset.config.rounds:
                    break
                segment = await interaction.turn(f"Again: say {word}.")
        interaction.trace.record_reward("rounds", sum(scores) / len(scores) if scores else 0.0, 1.0)


__all__ = ["Rounds", "RoundsEnv"]
