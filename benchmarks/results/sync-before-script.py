# How benchmarks/results/sync-before.json was measured: run with PYTHONPATH at a checkout of commit 35972b0.
import json
import statistics
import sys
import tempfile
import time

sys.path.insert(0, "/tmp/before")
import ray

from grpo_ray.config import load_recipe
from grpo_ray.controller import Controller, connect
from grpo_ray.setup_run import setup_run

M = "tiny://qwen2?layers=8&hidden=1024&heads=8&kv_heads=2&vocab=8000&tie=0&seed=0"
out = {}


def kb(pid, key):
    return next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith(key + ":"))


for bucket in (32, 256):
    d = tempfile.mkdtemp()
    r = load_recipe(
        "/tmp/before/recipes/tiny-cpu.yaml",
        [
            f"model.path={M}",
            f"trainer.bucket_mb={bucket}",
            "algorithm.kl_coef=0",
            "data.response_prefix=''",
            f"trainer.output_dir={d}",
            "trainer.loggers=[jsonl]",
            "trainer.val_before_train=false",
        ],
    )
    inputs = setup_run(r)
    connect(r)
    c = Controller(r, inputs)
    try:
        c.start(("learner", "generator"))
        c.push_weights(0)
        ts, probes = [], []
        l0, e0 = c.pools.actors["learner"][0], c.pools.actors["generator"][0]
        extra = []
        for k in range(1, 4):
            pids = [ray.get(a.where.remote())["pid"] for a in (l0, e0)]
            base = []
            for pid in pids:
                open(f"/proc/{pid}/clear_refs", "w").write("5")
                base.append(kb(pid, "VmRSS"))
            t = time.perf_counter()
            c.push_weights(k)
            ts.append(time.perf_counter() - t)
            extra.append([(kb(pid, "VmHWM") - b) / 1e6 for pid, b in zip(pids, base)])
            t = time.perf_counter()
            c.probe()
            probes.append(time.perf_counter() - t)
        nbytes = sum(m.numel * 4 for m in c.pools.metas)
        out[bucket] = {
            "push_s": statistics.median(ts),
            "probe_s": statistics.median(probes),
            "bytes": nbytes,
            "GBps": nbytes / statistics.median(ts) / 1e9,
            "extra_rss_gb": {"learner": max(e[0] for e in extra), "engine": max(e[1] for e in extra)},
        }
        print(bucket, out[bucket], flush=True)
    finally:
        c.shutdown()
        ray.shutdown()
json.dump(out, open("/tmp/before_sync.json", "w"))
