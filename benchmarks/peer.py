"""grpo-ray against a single-process GRPO trainer (TRL's ``GRPOTrainer``, HF generation) doing equal work, in one run.

    bash benchmarks/peer.sh --steps 3 --out benchmarks/results/peer

(peer.sh installs TRL into .peer/, beside .venv and not a dependency of grpo-ray, then runs this script.)

Equal work, per optimizer step, on both sides:
  - the same model: a 14.3M-parameter Qwen2-shaped model built offline (random init, 384-token vocabulary),
  - the same prompts (--workload select: the quick start's task, 8 a step, 8 samples each; gsm8k: GSM8K's
    questions, 4 a step, 16 samples each), at most 128 response tokens at temperature 1 (a random-init model
    rarely stops early, so most samples run to 128),
  - a KL term to a frozen reference (k3, coefficient 1e-3): a reference forward over every sample,
  - one optimizer step over the 64 samples (one PPO epoch, no old-policy forward),
  - the same thread budget: the machine's cores (TRL: one process with that many threads; grpo-ray: its pools
    share them as the recipe's thread settings say).
Tokens/s counts prompt + response tokens of the step's samples over the step's wall time, each side's own counts.
Each configuration runs --warmup steps, then --steps timed steps. grpo-ray's configurations are a series of
levers, each on top of another (OURS), and one lever no recipe key reverts, the generator's heap settings, is
measured on raw vLLM (HEAP). Writes peer.json and peer.md to --out: the ratios, and a table of what each lever gave.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine, step_parser, timed_steps, write_report  # noqa: E402

MODEL = "tiny://qwen2?layers=6&hidden=512&heads=8&kv_heads=4&intermediate=1024&vocab=384&seed=0"
PROMPTS, GROUP, KL = 8, 8, 1e-3
COMMON = [
    f"data.train_batch_size={PROMPTS}",
    f"algorithm.group_size={GROUP}",
    "data.response_prefix=''",
    "data.max_prompt_length=64",
    f"algorithm.kl_coef={KL}",
    "algorithm.kl_estimator=k3",
    "learner.mini_batch_size=64",
    "learner.micro_batch_size=16",
    "reference.micro_batch_size=32",
    "trainer.max_sync_logprob_diff=1e-2",
    "trainer.total_steps=1000",
    "learner.optim.lr=1e-6",
]
WORKLOADS = {
    "select": [],
    # GSM8K's training questions (../shared/data, prepared into a temporary folder at run time): with this
    # model's 384-token vocabulary a prompt is 259 tokens on average (GSM8K's share of a step's tokens, or more),
    # in 4 groups of 16, a recipe's shape; prompts over 320 tokens dropped on both sides
    "gsm8k": [
        "data.train_batch_size=4",
        "algorithm.group_size=16",
        "data.max_prompt_length=320",
        "reference.micro_batch_size=16",
    ],
    # MATH-500's problems (its test split, the only one: a throughput comparison, not an evaluation), scored by
    # the math reward on both sides; prompts over 320 tokens dropped on both sides
    "math500": ["data.max_prompt_length=320", "reward.functions=[{name: math, weight: 1.0}]"],
}
DATA = {"gsm8k": ("gsm8k", "train"), "math500": ("math500", "test")}
"""A workload's data: the shared folder it is prepared from, and the split it trains on."""
"""--workload: overrides of COMMON: the quick start's task (short prompts, the issue's benchmark), GSM8K or
MATH-500."""
BF16 = ["generator.dtype=bfloat16", "learner.dtype=bfloat16"]
ONE_STEP_OFF = [*BF16, "algorithm.max_staleness=1"]
PACKED = ["model.shared_prompt=false"]  # a lever's meaning kept under model.shared_prompt: auto, the default
# grpo-ray's configurations, each one lever on top of the configuration it names (None: the first); the quick
# start's CPU shares: generator 0.5, learner 2 x 0.5, reference 0.25, reward 0.25
OURS = {
    "grpo-ray fp32, threads = reserved CPUs, padded": (
        ["cluster.cpu_threads=reserved", "model.sequence_packing=false", *PACKED],
        None,
        "each actor runs as many threads as its reserved CPUs, rounded up to 1; every sample padded to the longest",
    ),
    "grpo-ray fp32, threads follow the schedule, padded": (
        ["model.sequence_packing=false", *PACKED],
        "grpo-ray fp32, threads = reserved CPUs, padded",
        "on-policy the phases run one at a time: each takes the node's cores (generator 2, reference 2, learner 2 x 1)",
    ),
    "grpo-ray fp32": (
        PACKED,
        "grpo-ray fp32, threads follow the schedule, padded",
        "sequence packing (model.sequence_packing): several samples to a row in the learner's and the reference's "
        "forwards",
    ),
    "grpo-ray bf16": (
        [*BF16, *PACKED],
        "grpo-ray fp32",
        "bf16 compute everywhere: vLLM's weights, the learner's FSDP2 mixed precision, the reference",
    ),
    "grpo-ray bf16, one step off": (
        [*ONE_STEP_OFF, "algorithm.rollout_correction.rollout_is=token", *PACKED],
        "grpo-ray bf16",
        "generation of the next batch overlaps this step's reference and update; the old policy recomputed "
        "(an extra forward), token-level IS",
    ),
    "grpo-ray bf16, one step off, bypass": (
        [*ONE_STEP_OFF, "algorithm.rollout_correction.bypass_mode=true", *PACKED],
        "grpo-ray bf16",
        "one step off with the sampler's logprobs as the old policy (no extra forward)",
    ),
    "grpo-ray fp32, default settings": (
        [],
        "grpo-ray fp32",
        "the defaults as they are: model.shared_prompt: auto chooses each step between packing and shared prompts",
    ),
    "grpo-ray fp32, shared prompts": (
        ["model.shared_prompt=true"],
        "grpo-ray fp32",
        "each prompt run once a group (model.shared_prompt), in the learner's and the reference's forwards, instead "
        "of packing whole samples",
    ),
    "grpo-ray fp32, one step off, bypass, shared prompts": (
        ["algorithm.max_staleness=1", "algorithm.rollout_correction.bypass_mode=true", "model.shared_prompt=true"],
        "grpo-ray fp32, shared prompts",
        "fp32, generation of the next batch overlapping this step's reference and update, the sampler's logprobs as "
        "the old policy (no extra forward)",
    ),
    "grpo-ray bf16, one step off, bypass, shared prompts": (
        [*ONE_STEP_OFF, "algorithm.rollout_correction.bypass_mode=true", "model.shared_prompt=true"],
        "grpo-ray bf16, one step off, bypass",
        "each prompt run once a group (model.shared_prompt)",
    ),
}
HEAP = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "1048576"}
"""The generator's environment before this lever: glibc's mmap threshold fixed at 64 KiB (now: glibc's default
and the heap trimmed once a generate call). Measured on raw vLLM, as no recipe key brings it back."""
PEERS = {"TRL fp32": {"bf16": False}, "TRL bf16": {"bf16": True}}


def ours(name: str, common: list[str], overrides: list[str], warmup: int, steps: int) -> dict:
    rows, wall = timed_steps([*common, *overrides], warmup, steps)
    tokens = sum(m["perf/total_num_tokens"] for m in rows)
    parts = {
        k.split("/", 1)[1]: statistics.fmean(m[k] for m in rows)
        for k in rows[0]
        if k.startswith("timing_s/") and k != "timing_s/step"
    }
    return {
        "name": name,
        "overrides": overrides,
        "step_s": wall / steps,
        "tokens_per_s": tokens / wall,
        "response_length": statistics.fmean(m["response_length/mean"] for m in rows),
        "prompt_length": statistics.fmean(m["prompt_length/mean"] for m in rows),
        "parts": parts,
        "probe_diff": max(m["sync/logprob_diff"] for m in rows if "sync/logprob_diff" in m),
        "mismatch_kl": statistics.fmean(m["rollout_corr/kl"] for m in rows),
        "shared_prompt_steps": sum(m.get("actor/shared_prompt", 0) for m in rows),  # of the timed steps
    }


def heap_lever(common: list[str], reps: int) -> dict:
    """Raw vLLM generating one step's work in the fp32 configuration, with the old heap settings and without."""
    from benchmarks.bench import raw_vllm_spec, run_child
    from grpo_ray.config import load_recipe
    from grpo_ray.device import Device
    from grpo_ray.setup_run import setup_run
    from grpo_ray.types import Prompt

    with tempfile.TemporaryDirectory() as tmp:
        r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [*common, f"trainer.output_dir={tmp}/run"])
        inputs = setup_run(r)
    prompts = [Prompt.from_row(uid, row) for uid, row in enumerate(inputs.train_rows[: r.data.train_batch_size])]
    spec, env = (
        raw_vllm_spec(r, inputs.model_path, prompts, reps),
        Device("cpu").engine_env(os.cpu_count(), r.generator.enforce_eager),
    )
    before, after = run_child("vllm", {**spec, "trim": False}, {**env, **HEAP}), run_child("vllm", spec, env)
    return {"before_s": before["seconds"], "after_s": after["seconds"], "tokens": after["tokens"]}


def peer(name: str, common: list[str], settings: dict, warmup: int, steps: int) -> dict:
    """TRL in a child process (its own environment: PYTHONPATH=.peer)."""
    from grpo_ray.config import load_recipe
    from grpo_ray.setup_run import setup_run

    with tempfile.TemporaryDirectory() as tmp:
        r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", [*common, f"trainer.output_dir={tmp}/run"])
        inputs = setup_run(r)
        spec = {
            "model": inputs.model_path,
            "prompts": [row["prompt_text"] for row in inputs.train_rows[:512]],
            "prompts_per_step": r.data.train_batch_size,
            "group": r.algorithm.group_size,
            "answers": [row["reward_model"]["ground_truth"] for row in inputs.train_rows[:512]],
            "reward": r.reward.functions[0].name,
            "max_tokens": r.generator.sampling.max_tokens,
            "warmup": warmup,
            "steps": steps,
            "threads": os.cpu_count(),
            "out": f"{tmp}/trl",
            **settings,
        }
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "PYTHONPATH": str(ROOT / ".peer"), "OMP_NUM_THREADS": str(os.cpu_count())}
        res = subprocess.run(
            [sys.executable, __file__, "--trl", f"{tmp}/spec.json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=3600,
        )
    lines = [line for line in res.stdout.splitlines() if line.startswith("TRL ")]
    if res.returncode or not lines:
        raise SystemExit(f"{name}: exit {res.returncode}\n{res.stderr[-3000:]}")
    return {"name": name, "settings": settings, **json.loads(lines[-1][4:])}


def trl_child(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_ray.rewards import BUILTIN

    torch.set_num_threads(spec["threads"])
    tok = AutoTokenizer.from_pretrained(spec["model"])
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    data = Dataset.from_dict({"prompt": spec["prompts"], "answer": spec["answers"]})
    score = BUILTIN[spec["reward"]]

    def reward(completions, answer, **_):
        return [score(c, a) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends, self.logs = [], []

        def on_step_begin(self, args, state, control, **kw):
            if state.global_step == spec["warmup"]:
                self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append(dict(logs or {}))

    clock = Clock()
    n = spec["prompts_per_step"] * spec["group"]
    cfg = GRPOConfig(
        output_dir=spec["out"],
        max_steps=spec["warmup"] + spec["steps"],
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=spec["group"],
        max_completion_length=spec["max_tokens"],
        temperature=1.0,
        beta=KL,
        num_iterations=1,
        learning_rate=1e-6,
        use_cpu=True,
        bf16=spec["bf16"],
        gradient_checkpointing=False,  # its default (True) recomputes the forward: off, TRL's faster setting
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=cfg, train_dataset=data, processing_class=tok, callbacks=[clock]
    )
    trainer.train()
    wall = clock.ends[-1] - clock.start
    timed = [log for log in clock.logs if "completions/mean_length" in log][spec["warmup"] :]
    completion = statistics.fmean(log["completions/mean_length"] for log in timed)
    prompt_len = statistics.fmean(len(tok(p)["input_ids"]) for p in spec["prompts"][: spec["prompts_per_step"] * 4])
    return {
        "step_s": wall / spec["steps"],
        "tokens_per_s": (prompt_len + completion) * n * spec["steps"] / wall,
        "response_length": completion,
        "prompt_length": prompt_len,
    }


def markdown(report: dict) -> str:
    m, runs = report["machine"], report["runs"]
    base = next((r for r in runs if r["name"] == "TRL fp32"), runs[0] if runs else {}).get("tokens_per_s", 1.0)
    lines = [
        "# grpo-ray against TRL's GRPOTrainer, equal work",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; torch {m['torch']}, vLLM {m['vllm']}, "
        f"Ray {m['ray']}, TRL {report['trl']}; {m['date']}. `python benchmarks/peer.py --steps {report['steps']} "
        f"--warmup {report['warmup']} --workload {report['workload']}{report.get('flags', '')}`: "
        f"{report['params'] / 1e6:.1f}M parameters ({report.get('model', MODEL)}), {report['workload']} prompts: "
        f"{report['prompts_per_step']} a step x {report['group']} samples, "
        f"at most {report.get('max_tokens', 128)} response tokens, KL to a reference (k3, {KL}), one optimizer step a step; "
        f"{m['cores']} cores for everything. Equal work is defined in the script's docstring.",
        "",
        "| configuration | step (s) | tokens/s | vs TRL fp32 | prompt / response tokens | parts (s) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.get("parts", {}).items()) if v >= 0.01)
        lines.append(
            f"| {r['name']} | {r['step_s']:.2f} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base:.2f}x "
            f"| {r['prompt_length']:.0f} / {r['response_length']:.0f} | {parts} |"
        )
    trl16 = next((r for r in runs if r["name"] == "TRL bf16"), None)
    if trl16:
        best = max(
            (r for r in runs if "bf16" in r["name"] and r["name"] != "TRL bf16"),
            key=lambda r: r["tokens_per_s"],
            default=None,
        )
        if best:
            lines += [
                "",
                f"Against TRL's best CPU setting (bf16): {best['name']}, "
                f"{best['tokens_per_s'] / trl16['tokens_per_s']:.2f}x its tokens/s.",
            ]
    by_name = {r["name"]: r for r in runs}
    levers = [(r["lever"], by_name[r["base"]]["step_s"], r["step_s"]) for r in runs if by_name.get(r.get("base"))]
    if levers or report.get("heap"):
        lines += [
            "",
            "## What each lever gave",
            "",
            "Each grpo-ray configuration above is one lever on top of another: step seconds before and after, "
            "same run.",
            "",
            "| lever | before (s) | after (s) | change |",
            "| --- | --- | --- | --- |",
        ]
        lines += [f"| {lever} | {a:.2f} | {b:.2f} | {(b - a) / a:+.0%} |" for lever, a, b in levers]
        if report.get("heap"):
            h = report["heap"]
            lines.append(
                f"| generator heap: glibc's default mmap threshold and a trim once a generate call, instead of "
                f"a threshold fixed at 64 KiB (raw vLLM, one fp32 step's generation, {h['tokens']} tokens: "
                f"generation seconds) | {h['before_s']:.2f} | {h['after_s']:.2f} | "
                f"{(h['after_s'] - h['before_s']) / h['before_s']:+.0%} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = step_parser(3, 1, "benchmarks/results/peer")
    ap.add_argument("--only", nargs="*", help="configurations to run (default: all)")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="select")
    ap.add_argument("--model", default=MODEL, help="a tiny:// model name (default: the 14.3M Qwen2 shape)")
    ap.add_argument("--max-tokens", type=int, default=128, help="response tokens at most")
    args = ap.parse_args()
    from grpo_ray.config import load_recipe
    from grpo_ray.models.dims import model_dims

    common = [
        f"model.path={args.model}",
        f"generator.sampling.max_tokens={args.max_tokens}",
        *COMMON,
        *WORKLOADS[args.workload],
    ]
    if args.workload in DATA:
        from grpo_ray.data.prepare import prepare

        name, split = DATA[args.workload]
        data = tempfile.mkdtemp(prefix=f"grpo-peer-{name}-")
        prepare(name, str(ROOT.parent / "shared" / "data" / name), data)
        common.append(f"data.train_files=[{data}/{split}.parquet]")
    r = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", common)

    pick = lambda name: not args.only or name in args.only  # noqa: E731
    runs = [peer(n, common, s, args.warmup, args.steps) for n, s in PEERS.items() if pick(n)]
    runs += [
        {**ours(n, common, o, args.warmup, args.steps), "base": base, "lever": lever}
        for n, (o, base, lever) in OURS.items()
        if pick(n)
    ]
    heap = heap_lever(common, args.steps) if pick("heap") else None
    trl = subprocess.run(
        [sys.executable, "-c", "import trl; print(trl.__version__)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / ".peer")},
    ).stdout.strip()
    report = {
        "machine": machine(),
        "steps": args.steps,
        "warmup": args.warmup,
        "trl": trl,
        "workload": args.workload,
        "prompts_per_step": r.data.train_batch_size,
        "group": r.algorithm.group_size,
        "params": model_dims(args.model).params,
        "model": args.model,
        "max_tokens": args.max_tokens,
        "flags": "".join(
            f" --{k} {v}"
            for k, v in (("model", args.model), ("max-tokens", args.max_tokens))
            if v != ap.get_default(k.replace("-", "_"))
        ),
        "runs": runs,
        "heap": heap,
    }
    write_report(args.out, "peer", report, markdown(report))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--trl":
        print("TRL " + json.dumps(trl_child(json.loads(Path(sys.argv[2]).read_text()))))
    else:
        main()
