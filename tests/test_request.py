"""The run request (contract/request.py): built once from the command line, stored in
results.json, and rebuilt from there by --resume; a run stored before it resumes from its
old metadata keys."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from pathlib import Path

import pytest

import run_bench
from contract.devices import DeviceError, resolve_device
from contract.request import (
    RequestError,
    RunRequest,
    request_from_old_metadata,
    resumed_request,
)
from contract.run_meta import parse_meta
from contract.schema import RESULTS_JSON, format_shape

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--device", "cpu", "--sizes", "n=4096;n=8192", "--kernels", "add", "--providers",
        "torch", "--dtypes", "fp32", "--check-only", "--no-plots", "--seed", "7"]


def _request(*argv: str) -> RunRequest:
    return run_bench.request_of(run_bench.parse_args(list(argv)))


def _meta(run: Path) -> dict:
    return json.loads((run / RESULTS_JSON).read_text())["metadata"]


def _cut_short(run: Path, drop_request: bool = False) -> dict:
    """The run as if interrupted after its first row (its request dropped: as written
    before the request was stored); returns its metadata as written."""
    doc = json.loads((run / RESULTS_JSON).read_text())
    meta = dict(doc["metadata"])
    if drop_request:
        # As written before the request was stored: its selection flattened beside the
        # metadata's own keys.
        sel = RunRequest.from_json(doc["metadata"].pop("request")).selection
        doc["metadata"].update(
            kernels=list(sel.kernels), dtypes=list(sel.dtypes), providers=list(sel.providers),
            # the cache modes as the run resolved them (TINY's CPU: warm)
            seed=sel.seed, check_only=sel.check_only, cache=list(sel.cache or ["warm"]),
            sizes=sel.sizes, explicit_shapes=[format_shape(x) for x in sel.shapes or ()])
    doc["rows"] = doc["rows"][:1]
    doc["metadata"].update(complete=False, interrupted=True)
    (run / RESULTS_JSON).write_text(json.dumps(doc))
    (run / "results.csv").unlink()
    return meta


def test_the_request_is_typed_frozen_and_survives_json() -> None:
    req = _request(*TINY, "--cache", "warm,cold", "--run-budget", "inf",
                   "--fp8-accum", "precise")
    sel = req.selection
    assert sel.kernels == ("add",) and sel.cache == ("warm", "cold")
    assert sel.sizes == "explicit" and sel.shapes == ({"n": 4096}, {"n": 8192})
    assert math.isinf(req.budgets.run) and not req.output.plots and sel.check_only
    assert req.device.fp8_accum == "precise" and sel.seed == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        sel.seed = 1  # type: ignore[misc]
    text = json.dumps(req.to_json(), allow_nan=False)  # strict JSON: inf as "inf"
    assert RunRequest.from_json(json.loads(text)) == req
    # Stored once, one object per concern: the groups, nothing flattened beside them.
    assert set(json.loads(text)) == {"selection", "device", "measurement", "budgets",
                                     "ceilings", "output", "gate", "fleet", "triton"}
    assert _request("--kernels", "all").selection.kernels == _request().selection.kernels


def test_the_request_json_types_name_every_field() -> None:
    # RequestJson and its groups' types are to_json's shape: exactly the fields.
    from contract import request as rq
    groups = typing.get_type_hints(rq.RequestJson)
    assert set(groups) == {f.name for f in dataclasses.fields(rq.RunRequest)}
    for name, t in rq._GROUPS.items():
        json_type = groups[name]
        assert set(json_type.__annotations__) == {f.name for f in dataclasses.fields(t)}
    assert set(rq.AcceptanceJson.__annotations__) == \
        {f.name for f in dataclasses.fields(rq.AcceptanceOptions)}
    assert set(rq.RunRequest().to_json()) == set(groups)


def test_a_request_stored_flat_by_an_earlier_version_reads_back_the_same() -> None:
    """results.json files written before the request was nested keep one key per field:
    they read back as the request they were, a renamed field under its new name."""
    req = _request(*TINY, "--run-budget", "30", "--fleet-tolerance", "7",
                   "--no-measure-ceilings")
    flat = {**{k: v for g in req.to_json().values() for k, v in g.items()}}
    flat = {{"key": "device", "row": "row_budget", "run": "run_budget",
             "measure": "measure_ceilings", "remeasure": "remeasure_ceilings",
             "cache_dir": "ceilings_dir", "tolerance": "fleet_tolerance"}.get(k, k): v
            for k, v in flat.items()}
    assert "row_budget" in flat and "device" in flat and len(flat) == 34  # its fields
    back = RunRequest.from_json(flat)
    assert back.budgets.run == 30.0 and back.fleet.tolerance == 7.0
    assert not back.ceilings.measure and back.device.key == "cpu"
    assert back.selection == req.selection
    with pytest.raises(RequestError, match="unknown field"):
        RunRequest.from_json({**flat, "from_the_future": 1})


def test_the_parsers_defaults_are_the_requests() -> None:
    """The command line's defaults come from the request's own (one place)."""
    req = _request()
    default = RunRequest()
    for group in ("measurement", "budgets", "ceilings", "gate", "fleet", "triton"):
        assert getattr(req, group) == getattr(default, group), group
    assert req.output == dataclasses.replace(default.output)
    assert req.device == default.device


@pytest.mark.parametrize("flags, word", [(["--kernels", "add,nope"], "kernel 'nope'"),
                                         (["--device", "tpu9"], "unknown device 'tpu9'"),
                                         (["--cache", ""], "--cache is empty")])
def test_a_bad_request_is_one_error_line_and_exit_2(flags, word, tmp_path, capsys) -> None:
    assert run_bench.main([*TINY, "--out", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and word in err and len(err.splitlines()) == 1


def test_a_resumed_run_rebuilds_the_request_it_stored(tmp_path: Path) -> None:
    out = str(tmp_path)
    assert run_bench.main([*TINY, "--out", out, "--run-id", "r1"]) == 0
    run = tmp_path / "cpu" / "r1"
    stored = _meta(run)["request"]
    original = _request(*TINY, "--out", out, "--run-id", "r1")
    assert RunRequest.from_json(stored) == original
    # The resume's own command line names other settings: the run's own win, and only
    # what a resume may change (its folder, gate, figures, ...) comes from it.
    cli = _request("--resume", str(run), "--out", out, "--kernels", "mul", "--seed", "1",
                   "--sizes", "quick", "--compare", "BASE", "--no-plots")
    resumed = resumed_request(cli, parse_meta(_meta(run)))
    assert dataclasses.replace(
        resumed, output=dataclasses.replace(resumed.output, resume=None, run_id="r1"),
        gate=dataclasses.replace(resumed.gate, compare=None)) == original
    assert resumed.output.resume == str(run) and resumed.gate.compare == "BASE"
    # ... and a real resume keeps the stored request and its rows' settings.
    _cut_short(run)
    assert run_bench.main(["--resume", str(run), "--out", out, "--kernels", "mul"]) == 0
    meta = _meta(run)
    assert meta["request"] == stored and "kernels" not in meta and "seed" not in meta
    assert RunRequest.from_json(meta["request"]).selection.kernels == ("add",)
    assert [r["shape"] for r in json.loads((run / RESULTS_JSON).read_text())["rows"]] == \
        ["n=4096", "n=8192"]


def test_a_run_stored_without_a_request_resumes_from_its_old_keys(tmp_path: Path) -> None:
    assert run_bench.main([*TINY, "--out", str(tmp_path), "--run-id", "old"]) == 0
    run = tmp_path / "cpu" / "old"
    original = RunRequest.from_json(_cut_short(run, drop_request=True)["request"])
    assert "request" not in _meta(run)
    assert run_bench.main(["--resume", str(run), "--out", str(tmp_path),
                           "--kernels", "mul", "--seed", "3"]) == 0
    after = json.loads((run / RESULTS_JSON).read_text())
    assert [r["shape"] for r in after["rows"]] == ["n=4096", "n=8192"]
    rebuilt = RunRequest.from_json(after["metadata"]["request"])
    # The run's own; its cache modes as its old keys held them, resolved (a CPU's warm).
    assert rebuilt.selection == dataclasses.replace(original.selection, cache=("warm",))
    assert rebuilt.device.key == original.device.key  # its fp8 mode: the one it ran
    assert rebuilt.measurement == original.measurement


@pytest.mark.parametrize("run", ["results/cpu/example", "results/h200/2026-11-26/quick",
                                 "results/h200/2026-11-26/fp8-precise"])
def test_the_saved_runs_rebuild_a_request_from_their_old_keys(run: str) -> None:
    meta = _meta(ROOT / run)
    assert "request" not in meta  # written before the request was stored
    req = request_from_old_metadata(parse_meta(meta), _request("--resume", run))
    sel = req.selection
    assert list(sel.kernels) == meta["kernels"] and req.device.key == meta["device_key"]
    assert sel.cache == tuple(meta.get("cache") or ["cold"]) and sel.seed == meta["seed"]
    if meta["sizes"] == "explicit":  # '*=8192': one size in every dimension
        assert sel.shapes == ({"*": 8192},)
    assert req.device.fp8_accum == (meta.get("fp8_accum") or None)


def test_old_metadata_with_explicit_sizes_it_does_not_list_cannot_resume() -> None:
    meta = {"kernels": ["add"], "dtypes": ["fp32"], "providers": ["torch"], "seed": 0,
            "device_key": "cpu", "sizes": "explicit"}
    with pytest.raises(RequestError, match="does not list"):
        request_from_old_metadata(parse_meta(meta), _request())


def test_the_device_is_resolved_in_one_place(monkeypatch) -> None:
    dev = resolve_device("cpu")
    assert dev.model.key == "cpu" and dev.present.kind == "cpu" and dev.warnings == ()
    with pytest.raises(DeviceError, match="--device h100 needs a CUDA GPU"):
        resolve_device("h100")


def test_inspects_child_gets_the_request_as_json(monkeypatch, tmp_path) -> None:
    """Under the interpreter --inspect compiles in a child process: it is handed the
    request itself (its fp8 mode settled), not a command line to parse again."""
    from types import SimpleNamespace

    from benches.inspect import compile as ins

    req = _request("--inspect", "--kernels", "add,matmul", "--dtypes", "bf16",
                   "--out", str(tmp_path), "--arch", "sm_100", "--fp8-accum", "precise")
    seen: list[list[str]] = []
    monkeypatch.setattr(ins.subprocess, "run",
                        lambda cmd, **kw: seen.append(cmd) or SimpleNamespace(returncode=0))
    monkeypatch.setattr("kernels.spec.interpreter_enabled", lambda: True)
    from kernels import spec

    before = spec.fp8_accum()
    try:
        assert ins.run_inspect(req) == 0
    finally:
        spec.set_fp8_accum(before)  # run_inspect set the request's for this process
    (cmd,) = seen
    assert cmd[cmd.index("--request") + 1:] == [json.dumps(req.to_json())]
    # The child reads it back as it was (ins.main's --request path).
    got: list[RunRequest] = []
    monkeypatch.setattr(ins, "run_inspect", lambda r: got.append(r) or 0)
    assert ins.main(cmd[cmd.index("--request"):]) == 0
    assert got == [req]


def test_retune_is_a_request_field_a_resume_may_set() -> None:
    """--retune reaches the request (and through it the sweep's GPU set-up), survives
    JSON, and a resume's own command line decides it (tuning afresh is not the run's
    selection)."""
    from contract.request import RESUME_FROM_COMMAND_LINE

    assert _request("--retune").triton.retune is True
    assert _request().triton.retune is False
    assert RunRequest.from_json(_request("--retune").to_json()).triton.retune is True
    assert "triton" in RESUME_FROM_COMMAND_LINE
