"""Checkpoint bookkeeping without a cluster: commit by rename, keep_last, the manifest check."""

import json

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
    assert manifest["files"]["learner/__0_0.distcp"] == 100 and checkpoint.problems(final) == []
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
