"""Engines added to a streaming run mid-run: how soon the generation rate rises (issue 78's target: two engines added
raise it within a step of their arrival).

The schedule's side alone, as a run drives it: the streaming batch source (``grpo_ray/sources/streaming.py``) and
``Engines.grow``, on engines without a model (Ray actors) that take a fixed time a group, one group at a time in the
order sent, each as on a device of its own, and a learner that takes a fixed time a step (overlapping the take ahead
at max_staleness 2, as the controller's does). What it measures is whether the prompts reach the new engines and
their groups are taken, not vLLM's speed: on this 2-core machine engines added share the same two cores, so a run
with real engines here could not show a rate rising. The run starts on one engine; two more (started before, as
``Pools.grow`` adds only engines that have loaded) join as step --join starts.

Reported per schedule, min / median / max over the repeats: each step's generation rate (groups finished on all
engines in the step's wall-clock window, over its length) and its time; the steps after the join until the rate is
2x the steps before's mean. Writes elastic-streaming.json and elastic-streaming.md to --out.

    python benchmarks/elastic_streaming.py --out benchmarks/results/elastic-streaming [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench import machine  # noqa: E402
from tests.test_sources import FakeGenerator, FakePools, Run  # noqa: E402


class TimedGenerator(FakeGenerator):
    """An engine that finishes the groups it is sent one at a time, `group_s` seconds each, in the order sent; a take
    waits for the sends before it and for `n` finished groups, and hands on the first `n`."""

    def __init__(self, group_s: float):
        super().__init__()
        self.group_s, self.queue, self.finished, self.times, self.sends = group_s, [], [], [], 0
        self.changed = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            with self.changed:
                self.changed.wait_for(lambda: self.queue)
            time.sleep(self.group_s)
            with self.changed:
                self.finished.append(self.queue.pop(0))
                self.times.append(time.time())
                self.changed.notify_all()

    def submit(self, prompts, n, seeds):
        with self.changed:
            self.queue += prompts
            self.submitted, self.sends = self.submitted + len(prompts), self.sends + 1
            self.changed.notify_all()

    def take(self, n, oldest_kept, sends=0):
        with self.changed:
            self.changed.wait_for(lambda: self.sends >= sends and len(self.finished) >= n)
            taken, self.finished = self.finished[:n], self.finished[n:]
        return self._answer(taken, 1)

    def finish_times(self):
        return self.times


class Spares(FakePools):
    """Engines joining at the next ``grow``: `spares`, started (and answering) before."""

    def grow(self):
        joined, self.spares = self.spares, []
        self.generators = self.generators + joined
        self.nodes["generator"] += [self.node() for _ in joined]
        return list(range(len(self.generators) - len(joined), len(self.generators)))


def one_run(ray, staleness: int, args, engines: int, joining: int) -> dict:
    """A streaming run on `engines`, `joining` more joining as step --join starts."""
    actor = ray.remote(TimedGenerator).options(num_cpus=0, max_concurrency=4)
    run = Run(ray, "streaming", staleness, engines=engines, steps=args.steps, elastic=3, batch=args.batch)
    for g in run.pools.generators:
        ray.kill(g)
    run.pools.__class__, run.pools.spares = Spares, []
    run.pools.generators = [actor.remote(args.group_s) for _ in range(engines)]
    spares = [actor.remote(args.group_s) for _ in range(joining)]
    ray.get([a.calls.remote() for a in [*run.pools.generators, *spares]])  # started
    windows = []
    for step in range(1, args.steps + 1):
        if step == args.join:
            run.pools.spares = spares
        start = time.time()
        run.engines.grow(run.version)
        run.source.next(step, run.version, (0.0, 0.0))
        learning = time.time()
        run.source.ahead(step, run.version)
        time.sleep(max(0.0, args.learn_s - (time.time() - learning)))
        run.version += 1
        run.engines.push(run.version)
        windows.append((start, time.time()))
    times = sorted(t for g in run.pools.generators for t in ray.get(g.finish_times.remote()))
    for g in run.pools.generators:
        ray.kill(g)
    rates = [sum(a <= t < b for t in times) / (b - a) for a, b in windows]
    return {"rates": rates, "step_s": [b - a for a, b in windows], "engines": len(run.pools.generators)}


SHAPES = {"1 engine, 2 joining": (1, 2), "1 engine throughout": (1, 0), "3 engines throughout": (3, 0)}
"""The run measured, and the two it is held against (engines at start, engines joining)."""


def lag(rates: list[float], join: int) -> int | None:
    """The steps after the join (0: the join's own) until the rate is 2x the mean of the steps before it (not the
    first, the stream filling)."""
    before = statistics.mean(rates[1 : join - 1])
    return next((k for k, r in enumerate(rates[join - 1 :]) if r >= 2 * before), None)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--join", type=int, default=5, help="the step as whose start the two engines join")
    p.add_argument("--batch", type=int, default=24, help="prompts (groups) a step")
    p.add_argument("--group-s", type=float, default=0.05, help="an engine's seconds a group")
    p.add_argument("--learn-s", type=float, default=0.3, help="the learner's seconds a step")
    args = p.parse_args()
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    runs = {
        f"streaming, max_staleness {s}, {name}": [one_run(ray, s, args, *shape) for _ in range(args.repeats)]
        for s in (1, 2)
        for name, shape in SHAPES.items()
    }
    ray.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), **vars(args)}
    meta["out"] = str(args.out)
    (args.out / "elastic-streaming.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    lines = [
        f"# Engines joining a streaming run ({meta['date']}; {meta['machine']['cpu']}, {meta['machine']['cores']} cores)",
        "",
        f"`{meta['command']}`: {args.batch} groups a step, an engine {args.group_s} s a group (one at a time), the "
        f"learner {args.learn_s} s a step; one engine, two more joining as step {args.join} starts, against one "
        f"engine and three throughout, in turn in one process. Per step, over {args.repeats} repeats: median "
        "(min-max).",
        "",
    ]
    for name, got in runs.items():
        lines += [f"## {name}", ""]
        if "joining" in name:
            lags = [lag(r["rates"], args.join) for r in got]
            lines += [f"steps after the join until the rate is 2x the steps before's: {lags}", ""]
        lines += [
            "| step | engines | groups/s | step s |",
            "| --- | --- | --- | --- |",
        ]
        for k in range(args.steps):
            rates, secs = [r["rates"][k] for r in got], [r["step_s"][k] for r in got]
            count = got[0]["engines"] if "joining" not in name or k + 1 >= args.join else 1
            lines.append(f"| {k + 1} | {count} | {spread(rates)} | {spread(secs)} |")
        lines.append("")
    (args.out / "elastic-streaming.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
