"""`plan --measure step` refuses what cannot run before it starts: a step whose memory
estimate (activations included) exceeds what the device has free, with the sizes that
would fit; a GPU asked for where none is; and an allocation failure anyway is one line."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from benches.step import measure as step_mod
from benches.step.transformer import StepError
from contract.models import ModelShape
from roofline.__main__ import main as roofline_main
from roofline.plan.step import ADVICE_HEADROOM, step_memory_estimate, what_fits

TINY_ARGS = ["plan", "--d-model", "64", "--layers", "2", "--heads", "4", "--d-ff", "256",
             "--vocab", "1000", "--seq-len", "32", "--device", "cpu"]
# The command that ran 343 s and died in the CPU allocator: about 77 GB by the estimate.
BIG_ARGS = ["plan", "--d-model", "2048", "--layers", "4", "--vocab", "256", "--seq-len",
            "16384", "--micro-batch", "8", "--measure", "step", "--device", "cpu",
            "--no-save"]
BIG = ModelShape("custom", 2048, 4, 4 * 2048, 256, 16384, 32, 32, tied=False)
GIB = 2**30


@pytest.fixture
def available(tmp_path, monkeypatch):
    """Set the host's available memory as the kernel reports it (/proc/meminfo)."""
    def set_to(nbytes: int) -> None:
        p = tmp_path / "meminfo"
        p.write_text(f"MemTotal:       {2 * nbytes // 1024} kB\n"
                     f"MemFree:        {nbytes // 2048} kB\n"
                     f"MemAvailable:   {nbytes // 1024} kB\n")
        monkeypatch.setattr(step_mod, "MEMINFO", str(p))
    return set_to


@pytest.fixture
def no_measuring(monkeypatch):
    monkeypatch.setattr(step_mod, "measure_model",
                        lambda *a, **k: pytest.fail("measured despite the refusal"))


def one_error_line(capsys, argv: list[str]) -> str:
    """The error line of a run that exits 2 with one (after any progress lines) and no
    traceback."""
    code = roofline_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and err[-1] == errors[0], err
    assert not any("Traceback" in line for line in err), err
    return errors[0]


def test_the_issues_step_is_refused_before_it_starts(capsys, available, no_measuring):
    available(4 * GIB)
    err = one_error_line(capsys, BIG_ARGS)
    need = sum(step_memory_estimate(BIG, 4, 8, "fp32").values())
    assert need > 70e9  # the activations' 73 GB: the old check counted 3.5 GB
    assert f"needs at least {need / 1e9:.3g} GB" in err and "4.29 GB available" in err
    fits = what_fits(BIG, 4, 8, "fp32", ADVICE_HEADROOM * 4 * GIB)
    assert fits["measure_layers"] is None  # not even one block at this batch
    assert f"--micro-batch {fits['micro_batch']} with --measure-layers 1" in err
    assert f"--seq-len {fits['seq_len']} with --measure-layers 1" in err


def test_what_fits_is_the_largest_size_that_fits():
    limit = 4 * GIB
    f = what_fits(BIG, 4, 8, "fp32", limit)

    def need(shape: ModelShape, k: int, b: int) -> float:
        return sum(step_memory_estimate(shape, k, b, "fp32").values())
    assert need(BIG, 1, f["micro_batch"]) <= limit < need(BIG, 1, f["micro_batch"] + 1)
    s = f["seq_len"]
    assert need(replace(BIG, seq_len=s), 1, 8) <= limit < need(replace(BIG, seq_len=s + 1),
                                                               1, 8)
    between = (need(BIG, 2, 1) + need(BIG, 3, 1)) / 2  # 2 of 4 blocks fit at micro-batch 1
    assert what_fits(BIG, 4, 1, "fp32", between)["measure_layers"] == 2


def test_at_one_block_the_advice_is_batch_and_sequence(capsys, available, no_measuring):
    available(4 * GIB)
    err = one_error_line(capsys, [*BIG_ARGS, "--measure-layers", "1"])
    assert "--measure-layers" not in err.split("what fits")[1]
    fits = what_fits(BIG, 1, 8, "fp32", ADVICE_HEADROOM * 4 * GIB)
    assert re.search(rf"--micro-batch {fits['micro_batch']}\b", err)
    assert re.search(rf"--seq-len {fits['seq_len']}\b", err)


def test_a_smaller_slice_is_advised_when_one_fits(capsys, available, no_measuring):
    available(11 * GIB)  # 12.4 GB do not fit; 2 blocks at micro-batch 1 (6.2 GB) do
    argv = [a if a != "8" else "1" for a in BIG_ARGS]  # micro-batch 1
    err = one_error_line(capsys, argv)
    assert what_fits(BIG, 4, 1, "fp32", ADVICE_HEADROOM * 11 * GIB)["measure_layers"] == 2
    assert err.endswith("(the rest for temporaries): --measure-layers 2")  # sizes kept


def test_on_a_gpu_the_check_uses_its_free_memory(monkeypatch):
    # What torch.cuda reports, faked: 5 GB free of 80.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (5 * 10**9, 80 * 10**9))
    monkeypatch.setattr(step_mod, "measure_model",
                        lambda *a, **k: pytest.fail("measured despite the refusal"))
    assert step_mod.free_memory_bytes("cuda")[0] == 5e9
    shape = replace(BIG, seq_len=2048)  # 15 GB in bf16 by the estimate
    with pytest.raises(StepError, match="5 GB free on the GPU"):
        step_mod.measure_step(shape, 8, "cuda", "bf16", device_bytes=80e9)


@pytest.mark.parametrize("error", [
    RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate "
                 "68719476736 bytes."),
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    MemoryError(),
])
def test_running_out_of_memory_anyway_is_one_line(error, capsys, monkeypatch):
    def allocate(*a, **k):
        raise error
    monkeypatch.setattr(step_mod, "Transformer", allocate)  # the first allocation
    err = one_error_line(capsys, [*TINY_ARGS, "--measure", "step", "--no-save"])
    assert "ran out of memory" in err


def test_other_errors_are_not_taken_for_memory(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    monkeypatch.setattr(step_mod, "Transformer", broken)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        step_mod.measure_step(replace(BIG, d_model=64, heads=4, kv_heads=4, d_ff=256,
                                      seq_len=8, n_layers=1), 1, "cpu", "fp32")


def test_the_cpu_step_runs_under_an_address_space_cap(available, monkeypatch):
    """Past the memory available an allocation fails in the allocator (one line) rather
    than the kernel's OOM killer ending the process."""
    resource = pytest.importorskip("resource")
    before = resource.getrlimit(resource.RLIMIT_AS)
    available(2 * GIB)
    seen = []

    def measure(*a, **k):
        seen.append(resource.getrlimit(resource.RLIMIT_AS)[0])
        raise MemoryError
    monkeypatch.setattr(step_mod, "measure_model", measure)
    shape = ModelShape("t", 64, 1, 256, 100, 8, 4, 4, tied=False)
    with pytest.raises(StepError, match="ran out of memory"):
        step_mod.measure_step(shape, 1, "cpu", "fp32")
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    assert seen and abs(seen[0] - (mapped + 2 * GIB)) < 0.5 * GIB
    assert resource.getrlimit(resource.RLIMIT_AS) == before  # restored


@pytest.mark.parametrize("measure", [["--measure", "step"], ["--measure"]])
def test_a_gpu_device_without_a_gpu_is_one_line_for_both_measures(measure, capsys,
                                                                  monkeypatch, no_measuring):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [a if a != "cpu" else "h100" for a in TINY_ARGS]
    err = one_error_line(capsys, [*argv, *measure, "--no-save"])
    assert "--device h100 needs a CUDA GPU, but none is present" in err
