"""Read back what W&B wrote offline: the records of ``wandb/offline-run-*/run-<id>.wandb`` files.

Such a file is W&B's header (":W&B", a magic number, a version: 7 bytes) then LevelDB's log format: 32 KiB blocks
of records, each a 7-byte header (CRC, length, type: full, first, middle, last) and its bytes; a record's bytes are a
``wandb_internal_pb2.Record``. wandb 0.31 ships no Python reader of its own (its core is in Go), so the tests read
the files with this one.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, HEADER, W_AND_B = 32768, 7, 7


def records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, chunks = W_AND_B, []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:
            break
        chunks.append(data[pos + HEADER : pos + HEADER + length])
        pos += HEADER + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def run_files(wandb_dir: Path, run_id: str) -> list[Path]:
    """Every offline transaction log of run `run_id` (one per start: a resumed run writes another)."""
    return sorted(Path(wandb_dir).glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))


def history(files: list[Path]) -> list[dict]:
    """The logged rows, in order: {"_step": N, key: value, ...} (values as W&B stored them, JSON-decoded)."""
    rows = []
    for f in files:
        for r in records(f):
            if r.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
    return rows


def config(files: list[Path]) -> dict:
    """The run's config as W&B stored it (key -> JSON-decoded value), from its run and config records."""
    out = {}
    for f in files:
        for r in records(f):
            kind = r.WhichOneof("record_type")
            updates = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
            out.update({u.key: json.loads(u.value_json) for u in updates})
    return out


def runs(files: list[Path]) -> list[tuple[str, str, str]]:
    """(run id, project, display name) of each start."""
    return [
        (r.run.run_id, r.run.project, r.run.display_name)
        for f in files
        for r in records(f)
        if r.WhichOneof("record_type") == "run"
    ]
