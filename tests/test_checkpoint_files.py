"""Checkpoint bookkeeping without a cluster: commit by rename, keep_last, the manifest check."""

import hashlib
import json

import pytest

from grpo_ray import checkpoint


def fake_save(out, step, keep_last):
    tmp = checkpoint.staging_dir(out, step)
    (tmp / "learner").mkdir()
    (tmp / "learner" / ".metadata").write_bytes(b"m" * 10)
    (tmp / "learner" / "__0_0.distcp").write_bytes(b"x" * 100)
    cfg = out / "config.yaml"
    cfg.write_text("a: 1\n")
    return checkpoint.commit(
        tmp, str(out / "no-model"), {"step": step, "version": step}, {"step": step}, cfg, keep_last
    )


def test_keep_last_and_commit_by_rename(tmp_path):
    for step in (1, 2, 3, 4):
        final = fake_save(tmp_path, step, keep_last=2)
    assert final.name == "step_4" and not (tmp_path / "checkpoints" / ".tmp_step_4").exists()
    assert checkpoint.complete_steps(tmp_path / "checkpoints") == [3, 4]
    manifest = json.loads((final / "manifest.json").read_text())
    shard = manifest["files"]["learner/__0_0.distcp"]
    assert shard == {"size": 100, "sha256": hashlib.sha256(b"x" * 100).hexdigest()} and checkpoint.problems(final) == []
    (final / "learner" / "__0_0.distcp").unlink()
    assert checkpoint.problems(final) == [f"{final / 'learner' / '__0_0.distcp'} is missing"]
    assert checkpoint.find_resume(tmp_path, "auto", lambda _: None) == tmp_path / "checkpoints" / "step_3"
    assert checkpoint.find_resume(tmp_path, "disable") is None


def test_the_recipes_chat_template_goes_into_the_checkpoint(tmp_path):
    """model.chat_template replaces the model's template in the checkpoint (copied with the tokenizer from the
    model), so the tokenizer loaded from it, and the model exported from it, format prompts as the run did."""
    from transformers import AutoTokenizer

    from grpo_ray.models import PLAIN_TEMPLATE, resolve

    model = resolve("tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&seed=0")
    cfg = tmp_path / "config.yaml"
    cfg.write_text("a: 1\n")
    for step, template in ((1, ""), (2, PLAIN_TEMPLATE)):
        tmp = checkpoint.staging_dir(tmp_path, step)
        final = checkpoint.commit(tmp, model, {"step": step}, {"step": step}, cfg, 0, chat_template=template)
        messages = [{"role": "user", "content": "2+2?"}]
        text = AutoTokenizer.from_pretrained(final).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        assert (text == "2+2?") == bool(template), text  # plain: the prompt as it is; else the model's (ChatML)


def test_a_shard_of_the_right_size_with_other_contents_is_found_by_its_checksum(tmp_path, capsys):
    """A disk or copy fault that zeroes a shard keeps its size: the manifest's SHA-256 finds it. resume=auto falls
    back to the newest intact checkpoint and says so, a path to it fails in one line, and export refuses it before
    reading a weight; a manifest of sizes alone (before checksums) is still read."""
    for step in (1, 2):
        final = fake_save(tmp_path, step, keep_last=0)
    shard = final / "learner" / "__0_0.distcp"
    shard.write_bytes(bytes(100))  # same size, zeroed
    assert checkpoint.problems(final) == [
        f"{shard} is damaged (its contents are not the ones written: SHA-256 differs)"
    ]
    said = []
    assert checkpoint.find_resume(tmp_path, "auto", said.append) == tmp_path / "checkpoints" / "step_1"
    assert len(said) == 1 and "step_2 is not whole" in said[0] and "is damaged" in said[0]
    with pytest.raises(checkpoint.CheckpointError, match="cannot be loaded: .* is damaged"):
        checkpoint.find_resume(tmp_path, str(final))
    with pytest.raises(checkpoint.CheckpointError, match="cannot be exported: .* is damaged"):
        checkpoint.export_hf(final, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    manifest = json.loads((final / "manifest.json").read_text())
    manifest["files"] = {name: entry["size"] for name, entry in manifest["files"].items()}  # an older manifest
    (final / "manifest.json").write_text(json.dumps(manifest))
    assert checkpoint.problems(final) == []  # sizes alone cannot see the damage: what the checksums added


def test_a_jobs_export_moves_a_folder_it_did_not_write_aside_and_replaces_its_own(tmp_path):
    """<output_dir>/model is the job's own export (early stopping, sft, rm): an earlier export is replaced whole, a
    folder of the user's there is renamed aside with one line, never overwritten. A real checkpoint: a tiny model's
    weights saved by torch.distributed.checkpoint, as the learner saves them."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    from grpo_ray.models import resolve

    model = resolve("tiny://qwen2?layers=1&hidden=64&heads=2&kv_heads=1&seed=0")
    weights = AutoModelForCausalLM.from_pretrained(model).state_dict()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"model: {{path: '{model}', lora: {{rank: 0}}}}\n")
    tmp = checkpoint.staging_dir(tmp_path, 1)
    dcp.save({"model": weights}, checkpoint_id=str(tmp / "learner"))
    ckpt = checkpoint.commit(tmp, model, {"step": 1}, {"step": 1}, cfg, 0)
    mine = tmp_path / "model" / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("the user's")
    said = []
    out = checkpoint.run_export(ckpt, tmp_path, said.append)
    assert (out / "config.json").is_file() and (out / checkpoint.EXPORTED).is_file()
    assert (tmp_path / "model.user-1" / "notes.txt").read_text() == "the user's"
    assert len(said) == 1 and "moved to" in said[0] and "model.user-1" in said[0]
    said.clear()
    assert checkpoint.run_export(ckpt, tmp_path, said.append) == out and not said  # its own: replaced, no word
    assert not (tmp_path / "model.user-2").exists()
