"""The machine line timings carry, and the bf16 matmul probe behind it and behind Muon's precision: measured once
per machine and key, then read back from the cache; every benchmark prints the line before its numbers."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from pipeline import machine
from pipeline.cli import run_bench, stage_parser
from pipeline.config.stage_params import StageParams
from pipeline.machine import MatmulProbe, probe_matmul, read_cpu

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16 avx512_vnni
processor\t: 1
model name\t: AMD EPYC 9B14
"""


def test_the_cpu_is_its_model_and_the_simd_extensions_matmul_speed_follows(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO)
    cpu = read_cpu(cpuinfo)
    assert (cpu.model, cpu.flags) == ("AMD EPYC 9B14", ("avx2", "avx512f", "avx512_bf16"))
    assert cpu.cores >= 1
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n")  # no flags line (not x86): unknown, not none
    assert read_cpu(cpuinfo).flags is None


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty probe cache, in this process and on disk, and a count of real measurements."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(machine, "_probes", {})
    measured = []

    def measure(rows, cols, device):
        measured.append((rows, cols))
        return MatmulProbe(fp32_s=1.0, bf16_s=3.0)

    monkeypatch.setattr(machine, "_measure", measure)
    return measured


def test_a_probe_is_measured_once_then_read_back_from_the_cache_file(cache, monkeypatch):
    cpu = torch.device("cpu")
    assert probe_matmul(128, 640, cpu) == MatmulProbe(fp32_s=1.0, bf16_s=3.0)
    monkeypatch.setattr(machine, "_probes", {})  # a new process: only the file remains
    assert not probe_matmul(128, 640, cpu).bf16_fast
    assert cache == [(128, 640)]
    probe_matmul(4096, 4096, cpu)  # another size is another probe, capped where the ratio has settled
    assert cache == [(128, 640), (1024, 1024)]
    assert len(json.loads(machine.probe_cache_path().read_text())) == 2


def test_a_damaged_cache_file_is_measured_again_and_rewritten(cache):
    machine.probe_cache_path().parent.mkdir(parents=True)
    machine.probe_cache_path().write_text("{not json")
    probe_matmul(64, 64, torch.device("cpu"))
    assert cache == [(64, 64)]
    assert list(json.loads(machine.probe_cache_path().read_text()).values()) == [{"fp32_s": 1.0, "bf16_s": 3.0}]


def test_the_probe_measures_both_dtypes():
    probe = machine._measure(32, 48, torch.device("cpu"))
    assert probe.fp32_s > 0 and probe.bf16_s > 0


@pytest.mark.parametrize(("bf16_s", "says"), [(0.4, "bf16 matmul native (bf16 takes 0.40x"),
                                               (7.0, "bf16 matmul not native (bf16 takes 7.00x")])
def test_the_machine_line_says_what_the_probe_found(bf16_s, says, monkeypatch):
    monkeypatch.setattr(machine, "probe_matmul", lambda *_: MatmulProbe(fp32_s=1.0, bf16_s=bf16_s))
    line = machine.machine_line()
    assert line.startswith(f"{read_cpu().model}, {read_cpu().cores} cores, ") and says in line


def test_a_benchmark_prints_the_machine_line_before_its_numbers_and_nothing_on_bad_params(tmp_path, monkeypatch,
                                                                                          capsys):
    monkeypatch.setattr(machine, "machine_line", lambda: "AMD EPYC, 2 cores")
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"project": {"seed": 0}}))
    assert run_bench(stage_parser("b", "b"), StageParams, lambda *_: print("42 tokens/s"), ["--params", str(params)]) == 0
    assert capsys.readouterr().out.splitlines() == ["machine: AMD EPYC, 2 cores", "42 tokens/s"]
    params.write_text(yaml.safe_dump({"project": {"seed": "x"}}))
    assert run_bench(stage_parser("b", "b"), StageParams, lambda *_: print("42 tokens/s"), ["--params", str(params)]) == 2
    assert capsys.readouterr().out == ""
