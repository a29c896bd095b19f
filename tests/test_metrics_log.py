"""The console logger: a progress bar on a terminal, plain lines elsewhere; JSONL alongside."""

import io
import json
import sys
import time

from grpo_ray.telemetry import metrics
from grpo_ray.telemetry.metrics import LEGEND, MetricsLog, console_line


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_when_not_a_terminal(tmp_path, monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    log = MetricsLog(tmp_path, ["console", "jsonl"], total_steps=3)
    before = time.time()
    log.log(1, {"critic/score/mean": 0.25, "timing_s/step": 0.5})
    log.log(2, {"critic/score/mean": 0.5, "timing_s/step": 0.5, "reward/errors": 3.0, "reward/timeouts": 0.0})
    log.close()
    assert max(len(line) for line in LEGEND.splitlines()) <= metrics.CONSOLE_WIDTH
    assert out.getvalue() == (
        f"{LEGEND}\n"  # once, before the first step: what each short label stands for
        "step:1 score:0.25 s:0.5\n"
        "step:2 score:0.5 s:0.5 err:3 eta:0:00\n"
    )  # failures when some
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert before - 1 <= first.pop("time") <= time.time() + 1  # each row's wall-clock time
    assert first == {"step": 1, "critic/score/mean": 0.25, "timing_s/step": 0.5}


def test_progress_bar_on_a_terminal(tmp_path, monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setattr(sys, "stderr", term)  # tqdm draws on stderr by default
    log = MetricsLog(tmp_path, ["console"], total_steps=4)
    log.log(1, {"critic/score/mean": 0.5})
    log.log(2, {"critic/score/mean": 0.75})
    log.close()
    text = term.getvalue()
    assert "step:2 score:0.75" in text
    assert "2/4" in text and "score=0.750" in text  # steps done and the current score on the bar
    assert not (tmp_path / "metrics.jsonl").exists()


def test_the_eta_counts_steps_only_and_the_bar_starts_with_the_first_step(tmp_path, monkeypatch):
    """A minute and a half of start-up and validation does not enter the ETA: 10 s a step, 8 steps left."""
    clock = iter([100.0, 110.0, 200.0, 210.0])
    monkeypatch.setattr(metrics.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    log = MetricsLog(tmp_path, ["console"], total_steps=10, bar=False)
    log.log(0, {"val/gsm8k/pass@1": 0.1})
    log.log(1, {"critic/score/mean": 0.25})  # at 100 s
    log.log(2, {"critic/score/mean": 0.5})  # at 110 s
    assert out.getvalue().splitlines()[-1] == "step:2 score:0.5 eta:1:20"
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    log = MetricsLog(tmp_path, ["console"], total_steps=10, bar=True, done=4)
    log.log(0, {"val/gsm8k/pass@1": 0.1})
    assert log.bar is None  # nothing on the bar while pools start and the first validation runs
    log.log(5, {"critic/score/mean": 0.25})
    assert (log.bar.n, log.bar.total) == (5, 10)
    log.log(6, {"critic/score/mean": 0.5})
    assert log.bar.n == 6
    log.close()


def test_a_step_line_fits_120_columns():
    many = {f"val/src{i}/pass@{k}": 0.123456 for i in range(6) for k in (1, 16)}
    full = {
        "critic/score/mean": 0.123456789,
        "response_length/mean": 1234.5678,
        "actor/pg_loss": -1.23456e-05,
        "actor/kl_loss": 0.00123456,
        "actor/entropy": 1.23456,
        "actor/grad_norm": 12.3456,
        "sync/logprob_diff": 0.00123456,
        "timing_s/step": 123.456,
        "reward/errors": 256.0,
        "reward/timeouts": 256.0,
        **many,
    }
    line = console_line(12345, full, "1h02m")
    assert len(line) <= metrics.CONSOLE_WIDTH, (len(line), line)
    assert line == (
        "step:12345 score:0.123 len:1235 kl:0.00123 ent:1.23 gnorm:12.3 sync:0.00123 s:123 err:256 "
        "tmo:256 eta:1h02m +12 val"
    )  # failing rewards leave no room: the validations are counted
    del full["reward/errors"], full["reward/timeouts"]
    line = console_line(12345, full, "1h02m")
    assert len(line) <= metrics.CONSOLE_WIDTH, (len(line), line)
    assert " eta:1h02m val/src0@1:0.123 " in line
    assert line.endswith(f" +{len(many) - line.count('@')} val")  # those left out are counted
