"""The machine a timing was measured on, and whether bfloat16 matmul is fast on it.

A timing means little without its machine: the same commit trains the block drafter 6x slower per step on an
AVX2-only CPU than on one with AVX512-BF16, because bfloat16 matmul is native on one and emulated on
the other. Whether it is fast is measured here (`probe_matmul`: the same matmul timed in both dtypes), not read
off a vendor or flag string, and cached per device, torch version, thread count and size, so every process
after the first reads it back.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipeline.atomic import write_json_atomic

# the SIMD extensions fp32/bf16 matmul speed follows: AVX2, AVX-512, its bf16 dot products, Intel AMX tiles
SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
# The machine line's probe: large enough to be bound by arithmetic, not call overhead (here bf16 takes 0.4x
# fp32's time at 512 but 1.9x at 256, where the conversion dominates).
LINE_PROBE_SIDE = 512
# A probe of a bigger matrix costs seconds and tells nothing new: the ratio settles by this size.
MAX_PROBE_SIDE = 1024
PROBE_ROUNDS = 7  # the best of them: on a loaded machine most rounds are slowed by other processes
# small matrices repeat within a round (up to MAX_REPEATS times), so the timer's resolution is no factor
PROBE_FLOPS_PER_ROUND, MAX_REPEATS = 10**8, 50


@dataclass(frozen=True)
class Cpu:
    model: str
    flags: tuple[str, ...] | None  # those of SIMD_FLAGS it has; None: the OS does not say (no /proc/cpuinfo)
    cores: int  # usable by this process


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> Cpu:
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first CPU's: every core of a box is alike
    flags = set(fields["flags"].split()) if "flags" in fields else None
    return Cpu(model=fields.get("model name") or platform.processor() or "unknown CPU",
               flags=None if flags is None else tuple(flag for flag in SIMD_FLAGS if flag in flags),
               cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@dataclass(frozen=True)
class MatmulProbe:
    """Best-of-rounds seconds of one `x @ x.T` (x: rows x cols) in float32 and in bfloat16."""

    fp32_s: float
    bf16_s: float

    @property
    def bf16_ratio(self) -> float:
        return self.bf16_s / self.fp32_s

    @property
    def bf16_fast(self) -> bool:
        return self.bf16_s < self.fp32_s


def probe_cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "draftline" / "matmul_probe.json"


_probes: dict[str, MatmulProbe] = {}


def probe_matmul(rows: int, cols: int, device: torch.device) -> MatmulProbe:
    """`x @ x.T` timed in both dtypes on `device`, once per machine: cached in this process and in
    `probe_cache_path()` (an unreadable or unwritable cache only means probing again)."""
    rows, cols = min(rows, MAX_PROBE_SIDE), min(cols, MAX_PROBE_SIDE)
    key = f"{_device_name(device)}|torch {torch.__version__}|{torch.get_num_threads()} threads|{rows}x{cols}"
    if key in _probes:
        return _probes[key]
    path = probe_cache_path()
    cached = {}
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(path.read_text(encoding="utf-8"))
    try:
        probe = MatmulProbe(**cached[key])
    except (KeyError, TypeError):
        probe = _measure(rows, cols, device)
        with contextlib.suppress(OSError):
            write_json_atomic(path, {**(cached if isinstance(cached, dict) else {}), key: asdict(probe)})
    _probes[key] = probe
    return probe


def _device_name(device: torch.device) -> str:
    if device.type == "cpu":  # with the kernels torch dispatches to (ATEN_CPU_CAPABILITY can lower them)
        return f"{read_cpu().model} ({torch.backends.cpu.get_cpu_capability()})"
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def _measure(rows: int, cols: int, device: torch.device) -> MatmulProbe:
    matrices = {dtype: torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)).to(device, dtype)
                for dtype in (torch.float32, torch.bfloat16)}
    repeats = max(1, min(MAX_REPEATS, PROBE_FLOPS_PER_ROUND // (2 * rows * rows * cols)))
    best = {dtype: math.inf for dtype in matrices}
    for round_index in range(PROBE_ROUNDS + 1):  # round 0 warms up (allocator, kernel selection)
        for dtype, x in matrices.items():  # alternating, so a burst of load elsewhere hits both dtypes
            _synchronize(device)
            started = time.perf_counter()
            for _ in range(repeats):
                x @ x.T
            _synchronize(device)
            if round_index:
                best[dtype] = min(best[dtype], (time.perf_counter() - started) / repeats)
    return MatmulProbe(fp32_s=best[torch.float32], bf16_s=best[torch.bfloat16])


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def machine_line() -> str:
    """One line naming the CPU a timing was measured on: model, cores, SIMD extensions, bf16 matmul speed."""
    cpu = read_cpu()
    flags = "SIMD flags unknown" if cpu.flags is None else " ".join(cpu.flags) or "no AVX2/AVX-512/AMX"
    probe = probe_matmul(LINE_PROBE_SIDE, LINE_PROBE_SIDE, torch.device("cpu"))
    native = "native" if probe.bf16_fast else "not native"
    return (f"{cpu.model}, {cpu.cores} cores, {flags}; bf16 matmul {native} (bf16 takes {probe.bf16_ratio:.2f}x "
            f"fp32's time at {LINE_PROBE_SIDE}x{LINE_PROBE_SIDE}, {torch.get_num_threads()} threads); "
            f"torch {torch.__version__}")


def print_machine_line() -> None:
    """What every benchmark prints first, so its numbers name their machine."""
    print(f"machine: {machine_line()}", flush=True)
