"""Checkpoints that are whole or absent, and finding the one to resume from.

``<output_dir>/checkpoints/step_{N}/`` holds

    learner/             model and optimizer, torch.distributed.checkpoint (one shard file per rank); with LoRA
                         the adapters and their optimizer state only (the base weights are frozen)
    trainer_state.json   step, policy version, data position, LR scheduler state
    training_info.json   step, consumed samples, last validation score, and ``model_path``: the base model
                         resolved (an ``sft://`` warm start's cached directory), which a LoRA export loads
    config.yaml          the resolved recipe (secrets redacted)
    tokenizer files      copied from the model, so the checkpoint exports on its own
    manifest.json        every file above with its size and SHA-256, written last

A checkpoint is written into ``.tmp_step_{N}`` and renamed when complete: a crash mid-save
leaves a ``.tmp_`` directory that is never taken for a checkpoint. Before loading or exporting, the
manifest is checked against the files (missing, truncated or damaged shards, by size and contents,
and missing metadata); ``auto`` falls back to the newest checkpoint that passes and says so, an
explicit path fails naming the file.

Sampling needs no saved RNG state: every prompt at every step is sampled with its own seed,
a hash of (trainer.seed, step, prompt), and the data order is a function of (seed, epoch).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import yaml

from grpo_ray.config import LEARNER
from grpo_ray.errors import UserError

STEP_DIR = re.compile(r"^step_(\d+)$")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "config.json",
    "processor_config.json",  # a vision-language model's processor (its image processor's settings)
    "preprocessor_config.json",
)


class CheckpointError(UserError):
    """A checkpoint that cannot be loaded; the message names the file."""


def checkpoints_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def staging_dir(output_dir: Path, step: int) -> Path:
    """Where step N is written before it is complete; removes the leftovers of an earlier crash."""
    tmp = checkpoints_dir(output_dir) / f".tmp_step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit(
    tmp: Path,
    model_path: str,
    state: dict,
    info: dict,
    config_yaml: Path,
    keep_last: int,
    keep: frozenset[int] = frozenset(),
    chat_template: str = "",
    config: str = "",
) -> Path:
    """Finish a checkpoint written into `tmp`: state files, tokenizer, manifest, then the rename; then drop all
    but the newest `keep_last` (0: none dropped), never one of the steps in `keep` (the best: trainer.keep_best).
    `chat_template` (the recipe's model.chat_template, as text) replaces the model's: the checkpoint and what is
    exported from it format prompts as the run did. `config` (JSON) replaces the model's config.json: the model the
    learner trains when it is not the one at `model_path` (a reward model's classifier on a causal LM)."""
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))
    (tmp / "training_info.json").write_text(json.dumps({**info, "model_path": model_path}, indent=1))
    shutil.copy(config_yaml, tmp / "config.yaml")
    for name in TOKENIZER_FILES:
        if (Path(model_path) / name).is_file():
            shutil.copy(Path(model_path) / name, tmp / name)
    if chat_template:  # transformers reads chat_template.jinja before the tokenizer config's template
        (tmp / "chat_template.jinja").write_text(chat_template)
    if config:
        (tmp / "config.json").write_text(config)
    files = {
        str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": sha256(p)}
        for p in sorted(tmp.rglob("*"))
        if p.is_file()
    }
    (tmp / "manifest.json").write_text(json.dumps({"step": state["step"], "files": files}, indent=1))
    final = tmp.parent / f"step_{state['step']}"
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in [s for s in complete_steps(tmp.parent)[:-keep_last] if s not in keep] if keep_last > 0 else []:
        shutil.rmtree(tmp.parent / f"step_{old}", ignore_errors=True)
    return final


def complete_steps(root: Path) -> list[int]:
    """Steps of the committed (renamed) checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name)))


def sha256(path: Path) -> str:
    """The SHA-256 of a file's contents, read in 8 MiB pieces."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def problems(ckpt: Path) -> list[str]:
    """What is missing, truncated or damaged (its contents not the ones written: the manifest's SHA-256) in a
    checkpoint directory; empty when it is whole. A manifest of sizes alone (written before checksums) is checked
    by size."""
    manifest = ckpt / "manifest.json"
    if not manifest.is_file():
        return [f"{manifest} is missing"]
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as e:
        return [f"{manifest} is unreadable ({e})"]
    out = []
    for name, entry in files.items():
        path = ckpt / name
        size, digest = (entry, None) if isinstance(entry, int) else (entry.get("size"), entry.get("sha256"))
        if not path.is_file():
            out.append(f"{path} is missing")
        elif path.stat().st_size != size:
            out.append(f"{path} is truncated ({path.stat().st_size} of {size} bytes)")
        elif digest and sha256(path) != digest:
            out.append(f"{path} is damaged (its contents are not the ones written: SHA-256 differs)")
    if not any(name.startswith("learner/") and name.endswith(".metadata") for name in files):
        out.append(f"{ckpt / LEARNER / '.metadata'} is not in the manifest")
    return out


def find_resume(output_dir: Path, resume: str, say=print) -> Path | None:
    """The checkpoint to resume from: `resume` is 'auto' (newest whole one, if any), 'disable', or a path."""
    if resume == "disable":
        return None
    if resume != "auto":
        ckpt = Path(resume)
        if not ckpt.is_dir():
            raise CheckpointError(f"trainer.resume={resume!r}: no such checkpoint directory")
        found = problems(ckpt)
        if found:
            raise CheckpointError(f"trainer.resume={resume!r} cannot be loaded: " + "; ".join(found))
        return ckpt
    root = checkpoints_dir(output_dir)
    for step in reversed(complete_steps(root)):
        found = problems(root / f"step_{step}")
        if not found:
            return root / f"step_{step}"
        say(f"checkpoint step_{step} is not whole ({'; '.join(found)}): falling back to an earlier one")
    return None


def load_state(ckpt: Path) -> dict:
    return json.loads((ckpt / "trainer_state.json").read_text())


def export_hf(ckpt: Path, out: Path, max_shard_size: str = "5GB", overwrite: bool = False, say=print) -> Path:
    """A Hugging Face model directory from a checkpoint: consolidated safetensors (sharded with an index
    past `max_shard_size`), config, generation config and tokenizer. transformers and vLLM load it. A LoRA
    checkpoint gives the adapters alone in ``out/adapter`` (peft's format) and the model with them merged, from
    the base model the checkpoint recorded; where that base is not on this machine, the adapters alone (said).
    Nothing here resolves a recipe or trains. Written beside `out`, then renamed into place: an `out` that holds
    anything is refused unless `overwrite`, and then replaced whole (no shard of an earlier export left beside
    the new ones)."""
    import tempfile

    ckpt, out = Path(ckpt), Path(out)
    found = problems(ckpt)
    if found:
        raise CheckpointError(f"{ckpt} cannot be exported: " + "; ".join(found))
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise CheckpointError(f"{out} already holds files; nothing was written (--overwrite replaces it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        _export_into(ckpt, tmp, max_shard_size, say)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


EXPORTED = ".grpo-ray-export"
"""The file an export leaves in its directory: the checkpoint it came from and each file it wrote (its contents' hash,
or for a file over HASHED_UNDER its size and time), so that the directory is known as ours, untouched since."""
HASHED_UNDER = 16 << 20


def _files(out: Path) -> dict[str, str]:
    """Each file in `out` (but the marker) by its path there: its contents' hash, or a large one's size and time."""
    found = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name != EXPORTED):
        st = path.stat()
        found[str(path.relative_to(out))] = (
            hashlib.sha256(path.read_bytes()).hexdigest()
            if st.st_size < HASHED_UNDER
            else f"{st.st_size} bytes, written {st.st_mtime_ns}"
        )
    return found


def own_export(out: Path) -> bool:
    """Whether `out` is an export of the project's that nothing has changed since: its marker names every file in it,
    each as written."""
    try:
        marker = json.loads((out / EXPORTED).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("files") == _files(out)


def set_aside(out: Path, say) -> None:
    """Rename `out` (a folder of the user's, or one changed since the project wrote it) to ``<name>.user-<N>``."""
    aside = next(p for n in range(1, 10_000) if not (p := out.with_name(f"{out.name}.user-{n}")).exists())
    out.rename(aside)
    say(f"{out} held files this run did not write (or changed since): moved to {aside}, untouched")


def run_export(ckpt: Path, output_dir: Path, say=print) -> Path:
    """A job's own export of `ckpt` to <output_dir>/model, replacing an earlier export of the project's; a folder
    there that is not one as written (a model the user put there, a note beside an export) is renamed aside first,
    said in one line."""
    out = Path(output_dir) / "model"
    if out.exists() and any(out.iterdir()) and not own_export(out):
        set_aside(out, say)
    return export_hf(ckpt, out, overwrite=True, say=say)


def _export_into(ckpt: Path, out: Path, max_shard_size: str, say) -> None:
    """``export_hf``'s work, into the empty directory `out`."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from grpo_ray.config import LoraConfig
    from grpo_ray.models import lora

    hf_logging.disable_progress_bar()  # one shard of a small model: a bar would only clutter the output
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(ckpt / LEARNER, Path(tmp) / "full.pt")  # every shard, consolidated in this process
        weights = torch.load(Path(tmp) / "full.pt", weights_only=False)["model"]
    config = AutoConfig.from_pretrained(ckpt)
    recipe = yaml.safe_load((ckpt / "config.yaml").read_text())["model"]
    adapters = LoraConfig(**recipe.get("lora", {}))
    base = lora_base(ckpt, recipe["path"]) if adapters.rank else None
    if adapters.rank:  # the checkpoint holds the adapters only: the base model is the one the run trained on
        loaded = (
            AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            if base
            else AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        )  # for the adapters alone, its shape will do
        model = lora.wrap(loaded, adapters)
        expected = {name for name, _ in model.named_parameters() if lora.is_adapter(name)}
    else:
        model = model_class(config).from_config(config, dtype=torch.float32)
        expected = set(model.state_dict()) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or set(missing) & expected:
        raise CheckpointError(
            f"{ckpt}: weights do not match the model config (missing "
            f"{sorted(set(missing) & expected)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    out.mkdir(parents=True, exist_ok=True)
    if adapters.rank:
        model.save_pretrained(out / "adapter")  # a peft adapter directory: PeftModel.from_pretrained(base, it)
    if adapters.rank and not base:
        say(
            f"the run's base model ({recipe['path']}) is not on this machine: wrote the adapters alone (adapter/); "
            "merge them with peft's PeftModel.from_pretrained(base, adapter).merge_and_unload()"
        )
    else:
        model = model.merge_and_unload() if adapters.rank else model  # the merged model needs no peft
        model.tie_weights()
        model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    AutoTokenizer.from_pretrained(ckpt).save_pretrained(out)
    for name in ("generation_config.json", "processor_config.json", "preprocessor_config.json"):
        if (ckpt / name).is_file():
            shutil.copy(ckpt / name, out / name)
    (out / EXPORTED).write_text(json.dumps({"checkpoint": str(ckpt.resolve()), "files": _files(out)}, indent=1))


def model_class(config):
    """The transformers auto class of a checkpoint's model: a sequence classifier (a reward model) or a causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    classifier = any(a.endswith("ForSequenceClassification") for a in config.architectures or [])
    return AutoModelForSequenceClassification if classifier else AutoModelForCausalLM


def lora_base(ckpt: Path, model_path: str) -> str | None:
    """The base model of a LoRA checkpoint: the path it recorded (checkpoints before the record: the recipe's
    model.path, an ``sft://`` one found in the cache only); None when it is a directory not on this machine."""
    from grpo_ray import models

    info = json.loads((ckpt / "training_info.json").read_text()) if (ckpt / "training_info.json").is_file() else {}
    base = info.get("model_path")
    if base is None:
        try:
            base = models.resolve(model_path)
        except models.ModelNameError:
            return None
    local = base.startswith(("/", "./", "../", "~")) or Path(base).exists()
    return base if not local or (Path(base).expanduser() / "config.json").is_file() else None


def keep_metrics(path: Path, up_to: int) -> None:
    """Drop the lines of steps after `up_to` from a metrics file (a resumed run writes them again)."""
    if path.is_file():
        lines = [line for line in path.read_text().splitlines(keepends=True) if _step_of(line) <= up_to]
        path.write_text("".join(lines))


def last_logged(path: Path) -> int:
    """The last step a metrics file holds (0: none)."""
    steps = [_step_of(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return int(max((s for s in steps if s != float("inf")), default=0))


def _step_of(line: str) -> float:
    """The step of a metrics line; a line torn by a kill mid-write counts as after every checkpoint."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError):
        return float("inf")
