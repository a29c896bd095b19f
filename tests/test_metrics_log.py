"""The console logger: a progress bar on a terminal, plain lines elsewhere; JSONL alongside."""

import io
import json
import sys
import time

from grpo_ray.metrics import MetricsLog


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
    assert out.getvalue() == ("step:1 critic/score/mean:0.25 timing_s/step:0.5\n"
                              "step:2 critic/score/mean:0.5 timing_s/step:0.5 reward/errors:3\n")  # failures when some
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
    assert "step:2 critic/score/mean:0.75" in text
    assert "2/4" in text and "score=0.750" in text  # steps done and the current score on the bar
    assert not (tmp_path / "metrics.jsonl").exists()
