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
    return checkpoint.commit(tmp, str(out / "no-model"), {"step": step, "version": step}, {"step": step}, cfg, keep_last)


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
