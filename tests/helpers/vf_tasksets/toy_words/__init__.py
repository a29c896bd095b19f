"""A verifiers v1 taskset for the adapter's tests, written with verifiers' own classes as a taskset author writes
one (installed as a top-level module, as verifiers finds tasksets: tests put this folder on PYTHONPATH): say a word
back; the reward is the share of its letters the reply holds, and a configuration key (`words`) sets how many
words there are."""

import verifiers.v1 as vf

WORDS = ["pear", "plum", "fig", "lime", "kiwi", "date", "sloe", "yuzu"]


class WordData(vf.TaskData):
    word: str


class WordTask(vf.Task[WordData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def letters(self, trace) -> float:
        """The share of the word's letters the reply holds (partial credit, so that replies score apart)."""
        reply = str(trace.messages[-1].content) if trace.messages else ""
        return len(set(self.data.word) & set(reply)) / len(set(self.data.word))


class WordsConfig(vf.TasksetConfig):
    words: int = 4


class Words(vf.Taskset[WordTask, WordsConfig]):
    def load(self):
        for word in WORDS[: self.config.words]:
            yield WordTask(
                WordData(prompt=f"Say {word}.", system_prompt="Answer in one word.", word=word), self.config.task
            )


__all__ = ["Words"]
