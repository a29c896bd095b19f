"""The second deadline behind pytest-timeout, so that a hung test never runs until CI is killed.

pytest-timeout (pyproject's `timeout`, signal method) interrupts a test at its limit: the test fails with its stack
and the run goes on. Some hangs survive that interrupt: a `ray.get` cut short leaves Ray's core worker waiting, and
the test's own `ray.shutdown()` then blocks in Ray's C++ code, where no Python exception reaches it. So each test
also gets this watchdog thread, `GRACE_S` behind the limit. When it fires it prints every thread's stack, ends the
processes the test started (Ray, vLLM engines, servers: they carry the test's mark in their environment, so those
that outlived a killed parent are found too) and gives the test a moment to come back. A test that does not come
back ends the run there and then, with pytest's summary (the test failed, the slowest tests) printed first.

After a test that ran past its limit and did come back, its processes are ended too, so the next test starts clean.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import uuid

import psutil
import pytest

GRACE_S = 60.0
"""How long after pytest-timeout's interrupt the watchdog fires."""

BACK_S = 15.0
"""How long the watchdog waits, once it has ended the test's processes, for the test to come back."""

MARK = "GRPO_RAY_TEST_MARK"
"""The environment variable that marks the processes a test starts (children inherit it, Ray's workers too)."""


def limit_of(item: pytest.Item) -> float:
    """The item's pytest-timeout limit (marker, command line or ini), 0 for none."""
    from pytest_timeout import _get_item_settings

    return float(_get_item_settings(item).timeout or 0)


def marked(mark: str) -> list[psutil.Process]:
    """Every process on the machine that carries `mark` in its environment, this one left out."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARK) == mark:
                found.append(proc)
        except (psutil.Error, OSError):
            pass
    return found


def end_processes(mark: str) -> int:
    """SIGKILL the processes marked `mark`; how many there were."""
    procs = marked(mark)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
    return len(procs)


class Watchdog:
    def __init__(self, config: pytest.Config):
        self.config = config

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        limit = limit_of(item)
        if not limit:
            yield
            return
        mark = uuid.uuid4().hex
        os.environ[MARK] = mark
        back = threading.Event()
        threading.Thread(target=self._watch, args=(item, mark, limit, back), name="watchdog", daemon=True).start()
        start = time.monotonic()
        try:
            yield
        finally:
            back.set()
            os.environ.pop(MARK, None)
        if time.monotonic() - start >= limit:
            ended = end_processes(mark)
            if ended:
                self._say(
                    f"watchdog: {item.nodeid} ran past its {limit:.0f} s limit; ended {ended} process(es) it left"
                )

    def _watch(self, item: pytest.Item, mark: str, limit: float, back: threading.Event) -> None:
        if back.wait(limit + GRACE_S):
            return
        self._suspend_capture()
        self._say(
            f"\n{'+' * 30} watchdog {'+' * 30}\n{item.nodeid} is still running {limit + GRACE_S:.0f} s after it "
            f"started ({limit:.0f} s limit + {GRACE_S:.0f} s): pytest-timeout's interrupt did not end it. "
            "Every thread's stack:"
        )
        for ident, frame in sys._current_frames().items():
            if ident != threading.get_ident():
                name = next((t.name for t in threading.enumerate() if t.ident == ident), "?")
                self._say(f"--- thread {name} ({ident})\n" + "".join(traceback.format_stack(frame)))
        ended = end_processes(mark)
        self._say(f"watchdog: ended {ended} process(es) the test started; waiting {BACK_S:.0f} s for it to return")
        if back.wait(BACK_S):
            return
        self._say("watchdog: the test did not return: ending the run here")
        try:
            report = pytest.TestReport(
                item.nodeid,
                item.location,
                {},
                "failed",
                f"watchdog: still running {limit + GRACE_S + BACK_S:.0f} s after it started; the run ended here",
                "call",
                duration=limit + GRACE_S + BACK_S,
            )
            item.ihook.pytest_runtest_logreport(report=report)
            item.config.hook.pytest_sessionfinish(session=item.session, exitstatus=pytest.ExitCode.TESTS_FAILED)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(int(pytest.ExitCode.TESTS_FAILED))

    def _suspend_capture(self) -> None:
        capman = self.config.pluginmanager.getplugin("capturemanager")
        if capman:
            capman.suspend_global_capture(in_=True)

    def _say(self, text: str) -> None:
        self.config.get_terminal_writer().line(text)
        sys.stdout.flush()
