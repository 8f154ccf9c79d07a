"""A run's metadata as a typed record (contract/run_meta.py): its parts, one writer and
one loader; every committed run's metadata read back as written, the request stored
once (an old run's rebuilt from its flattened keys)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.run_meta import REQUEST_COPY, RunMeta, meta_json, parse_meta

ROOT = Path(__file__).resolve().parents[1]
RUNS = sorted(p for p in (ROOT / "results").rglob("results.json"))
EMPTY = (None, {}, [], False)


@pytest.mark.parametrize("path", RUNS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_every_committed_runs_metadata_reads_back_as_written(path):
    meta = json.loads(path.read_text())["metadata"]
    back = meta_json(parse_meta(meta))
    for k in set(meta) | set(back):
        if k in REQUEST_COPY or (k == "request" and "request" not in meta):
            continue
        assert back.get(k) == meta.get(k) or (back.get(k) in EMPTY and meta.get(k) in EMPTY), k
    # The request is stored once: no flattened copy is written back.
    assert not set(REQUEST_COPY) & set(back)
    assert back["request"]  # an old run's rebuilt from its keys


def test_an_old_runs_request_comes_from_its_flattened_keys():
    old = {"run_id": "r", "device_key": "h200", "kernels": ["matmul"], "dtypes": ["bf16"],
           "providers": ["torch", "triton"], "seed": 3, "sizes": "explicit",
           "explicit_shapes": ["M=8192,N=8192,K=8192"], "check_only": False}
    m = parse_meta(old)
    assert m.request == {"kernels": ["matmul"], "dtypes": ["bf16"],
                         "providers": ["torch", "triton"], "seed": 3, "check_only": False,
                         "sizes": "explicit", "device": "h200",
                         "shapes": ["M=8192,N=8192,K=8192"]}
    assert m.provenance.run_id == "r" and m.device.device_key == "h200" and m.device.on_gpu


def test_parts_update_by_name_and_unknown_keys_are_kept():
    m = parse_meta({"run_id": "r", "some_future_key": {"a": 1}})
    m2 = m.updated(state__complete=True, time__wall_s=1.5)
    assert m2.state.complete and m2.time.wall_s == 1.5 and not m.state.complete
    assert meta_json(m2)["some_future_key"] == {"a": 1}
    assert isinstance(RunMeta().device.capability, type(None))
