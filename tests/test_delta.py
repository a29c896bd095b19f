"""The delta weight transport (trainer.weight_transport=delta, grpo_ray/transports/delta.py): each bucket goes as the
elements that changed since the last push, and the receiver's weights stay bit for bit the sender's.

First its two sides over a real gloo group (two threads), bf16 and fp32, across several pushes with a learning
rate's worth of change; then, in the slow tier, a whole run with it against the same run with the collective
transport: the same weights reach the engines, so every sample and metric is the same."""

import json
import threading

import pytest
import torch

from grpo_ray import faults, sync
from grpo_ray.sync import Phases, WeightMeta
from grpo_ray.transports import delta
from grpo_ray.transports.delta import Delta
from grpo_ray.transports.delta_storage import DeltaStorage
from tests.conftest import run_cli


def sides(transport: str, tmp_path) -> tuple:
    """A sender and a receiver of `transport`, joined: over a real gloo group of two (two threads), or a folder."""
    if transport == "delta_storage":
        sender, receiver = DeltaStorage.__new__(DeltaStorage), DeltaStorage.__new__(DeltaStorage)
        for side in (sender, receiver):
            side.__dict__.update(dir=tmp_path, timeout_s=60.0, copies=delta.Copies())
            side.join({})
        return sender, receiver
    sender, receiver = Delta.__new__(Delta), Delta.__new__(Delta)
    for side in (sender, receiver):
        side.__dict__.update(
            backend="gloo",
            timeout_s=60.0,
            start_s=60.0,
            tp=1,
            group=None,
            copies=delta.Copies(),
            buffers=sync.Buffers(),
        )
    where = {"host": "127.0.0.1", "port": sync.free_port(), "world": 2}
    joined = threading.Thread(target=sender.join, args=({**where, "rank": 0},))
    joined.start()
    receiver.join({**where, "rank": 1})
    joined.join()
    return sender, receiver


def pushes(transport: str, dtype: str, steps: list[dict[str, torch.Tensor]], tmp_path, bucket_bytes: int = 20_000):
    """Push each of `steps` (name -> weights) from a sender to a receiver; per push, what the receiver holds
    afterwards, the bytes sent and the sender's counts; or the receiver's error."""
    metas = [WeightMeta(n, tuple(t.shape), dtype) for n, t in steps[0].items()]
    out, errors = [], []
    sender, receiver = sides(transport, tmp_path)

    def send(weights, version):
        def fill(bucket, flat):
            flat.copy_(torch.cat([weights[metas[i].name].reshape(-1) for i in bucket]))

        out[-1]["bytes"] = sender.send(metas, fill, bucket_bytes, Phases(), torch.device("cpu"), version)
        out[-1]["stats"] = dict(sender.stats)

    for version, weights in enumerate(steps, 1):
        out.append({})
        thread = threading.Thread(target=send, args=(weights, version))
        thread.start()
        try:
            got = {
                n: t.clone()
                for b in receiver.receive(metas, bucket_bytes, torch.device("cpu"), Phases(), version)
                for n, t in b
            }
        except RuntimeError as e:
            errors.append(str(e))
            thread.join()
            break
        thread.join()
        out[-1]["held"] = got
    return out, errors


def training(dtype: torch.dtype, steps: int, lr: float = 1e-3) -> list[dict[str, torch.Tensor]]:
    """Float32 master weights, a twentieth of their elements moved each step (so that a float32 engine, where every
    moved element changes, sees some unchanged too), cast to the engine's `dtype`; one tensor (a norm's) never
    changes."""
    gen = torch.Generator().manual_seed(0)
    master = {"w0": torch.randn(64, 96, generator=gen), "norm": torch.ones(96), "w1": torch.randn(3000, generator=gen)}
    out = []
    for _ in range(steps):
        out.append({n: t.to(dtype).clone() for n, t in master.items()})
        for n in ("w0", "w1"):
            moved = torch.rand(master[n].shape, generator=gen) < 0.05
            master[n] += lr * torch.randn(master[n].shape, generator=gen) * moved
    return out


TRANSPORTS = ["delta", "delta_storage"]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_delta_pushes_leave_the_receiver_bit_identical_with_fewer_bytes(transport, dtype, tmp_path):
    steps = training(getattr(torch, dtype), 4)
    out, errors = pushes(transport, dtype, steps, tmp_path)
    assert not errors
    whole = sum(t.numel() * t.element_size() for t in steps[0].values())
    for push, weights in zip(out, steps):
        assert all(
            torch.equal(
                push["held"][n].view(-1).view(delta.BITS[t.element_size()]),
                t.view(-1).view(delta.BITS[t.element_size()]),
            )
            for n, t in weights.items()
        )
    assert out[0]["bytes"] >= whole and out[0]["stats"]["tensors_touched"] == 3  # the first push: whole
    for push in out[1:]:  # then only what changed: the norm never, the others in part
        assert push["bytes"] < whole / 2 and push["stats"]["tensors_touched"] == 2
        assert 0 < push["stats"]["changed"] < push["stats"]["elements"] / 2


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_change_lost_on_the_way_is_caught_by_the_checksum(transport, monkeypatch, tmp_path):
    monkeypatch.setenv(faults.ENV, "corrupt_delta@3")
    monkeypatch.setenv(faults.DIR_ENV, str(tmp_path))
    out, errors = pushes(transport, "bfloat16", training(torch.bfloat16, 4), tmp_path)
    assert len(out) == 3 and len(errors) == 1
    assert (
        "delta push of version 3: bucket" in errors[0] and "a change was lost or applied to another base" in errors[0]
    )


def test_a_bucket_is_sent_whole_when_its_changes_would_take_more_bytes():
    flat = torch.zeros(100, dtype=torch.bfloat16)
    assert delta.sent_as(flat, None) == delta.DENSE
    assert delta.sent_as(flat, torch.arange(0)) == delta.SAME
    assert delta.sent_as(flat, torch.arange(34)) == delta.DENSE  # 34 x (4 + 2) bytes >= 200
    assert delta.sent_as(flat, torch.arange(33)) == delta.SPARSE


def test_tensors_touched_counts_the_tensors_with_a_change():
    metas = [WeightMeta("a", (4,), "bfloat16"), WeightMeta("b", (3,), "bfloat16"), WeightMeta("c", (5,), "bfloat16")]
    for changed, tensors in (([0], 1), ([4, 5, 6], 1), ([11], 1), ([3, 7], 2), ([], 0), ([0, 4, 7, 11], 3)):
        assert delta.touched(metas, [0, 1, 2], torch.tensor(changed, dtype=torch.int64)) == tensors, changed
    assert delta.touched(metas, [0, 1, 2], None) == 3  # sent whole


SAME_RUN = [
    "trainer.total_steps=3",
    "trainer.save_freq=0",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "generator.dtype=bfloat16",
    "trainer.max_sync_logprob_diff=0.05",  # a bf16 engine against the fp32 learner
    "learner.optim.lr=1e-5",  # an RL learning rate: a share of the bf16 values change a step
]


@pytest.mark.slow
def test_a_run_with_delta_pushes_trains_as_the_run_with_whole_ones(tmp_path):
    """The tiny quick start with bf16 engines, 3 steps, pushed whole and as deltas (over the collective's group and
    through storage): the engines hold the same weights
    after every push, so they sample the same answers and every training metric is the same, bit for bit; the
    delta pushes after the first send a share of the bytes."""
    rows = {}
    for transport in ("collective", "delta", "delta_storage"):
        out = tmp_path / transport
        res = run_cli(
            "train",
            "recipes/tiny-cpu.yaml",
            *SAME_RUN,
            f"trainer.weight_transport={transport}",
            f"trainer.output_dir={out}",
        )
        assert res.returncode == 0, res.stderr[-3000:]
        rows[transport] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for name in ("delta", "delta_storage"):
        for whole, part in zip(rows["collective"], rows[name], strict=True):
            same = [k for k in whole if k.startswith(("critic/", "actor/", "response_length/", "rollout_corr/"))]
            assert same and all(whole[k] == part[k] for k in same), [k for k in same if whole[k] != part[k]]
        first, *later = rows[name]  # the engines loaded the model from its files: the first push is whole
        assert first["sync/bytes_share"] > 1 and all(m["sync/bytes_share"] < 0.75 for m in later)


@pytest.mark.slow
def test_lora_adapters_go_as_deltas(tmp_path):
    """model.lora with the adapters synced alone (vLLM's LoRA slot), pushed as deltas: the engines score the probe as
    the learner does after every push, and the pushes after the first send what changed of the adapters."""
    out = tmp_path / "lora"
    res = run_cli(
        "train",
        "recipes/tiny-cpu.yaml",
        "trainer.total_steps=3",
        "trainer.save_freq=0",
        "trainer.test_freq=0",
        "trainer.val_before_train=false",
        "model.lora.rank=4",
        "model.lora.alpha=8",
        "model.lora.sync=adapters",
        "learner.optim.lr=1e-2",
        "trainer.weight_transport=delta",
        f"trainer.output_dir={out}",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    first, *later = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert first["sync/bytes_share"] > 1 and first["sync/changed_share"] == 1.0  # whole (and its headers)
    assert all(0 < m["sync/changed_share"] <= 1 and m["sync/logprob_diff"] < 1e-4 for m in [first, *later])
