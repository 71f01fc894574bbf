"""Every stage's wall time, named with its machine, and `draftline timings`: the table `make demo` ends with.

Each stage `dvc repro` runs (DVC sets DVC_STAGE) records, when it succeeds, its process's wall time (imports
included) and the machine line (pipeline/machine.py) in `<metrics_dir>/stage_times/<stage>.json`, written
atomically. That folder is no DVC output: a timing differs every run and must not make a stage stale, and
metrics/ is gitignored. A stage DVC skips keeps its last record; the table says when each was measured.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from pydantic import BaseModel, ValidationError

from pipeline.atomic import write_json_atomic
from pipeline.config.stage_params import StageParams
from pipeline.errors import DraftlineError

STAGE_TIMES_DIR = "stage_times"


class StageTime(BaseModel):
    stage: str
    wall_s: float
    finished: datetime
    machine: str


def process_wall_s(fallback_start: float) -> float:
    """Seconds since this process started (Linux: /proc), else since `fallback_start` (a `time.time()`)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        # field 22 of /proc/self/stat, counted after the parenthesized command name (which may hold spaces)
        started_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return uptime_s - started_ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - fallback_start


def record_stage_time(metrics_dir: Path, stage: str, wall_s: float) -> Path:
    from pipeline.machine import machine_line  # here: it imports torch, and `draftline --help` stays fast

    record = StageTime(stage=stage, wall_s=round(wall_s, 1), finished=datetime.now(timezone.utc).replace(microsecond=0),
                       machine=machine_line())
    return write_json_atomic(metrics_dir / STAGE_TIMES_DIR / f"{stage.replace('/', '_')}.json",
                             record.model_dump(mode="json"))


def load_stage_times(metrics_dir: Path) -> list[StageTime]:
    """The records under `metrics_dir`, in the order the stages finished."""
    records = []
    for path in sorted((metrics_dir / STAGE_TIMES_DIR).glob("*.json")):
        try:
            records.append(StageTime.model_validate_json(path.read_text(encoding="utf-8")))
        except ValidationError:
            raise DraftlineError(f"{path} is not a stage timing record; delete it (the stage's next run writes "
                                 "it again)") from None
    return sorted(records, key=lambda record: record.finished)


def timings_table(records: list[StageTime]) -> str:
    """A per-stage wall-time table with a total, then the machine(s) they were measured on: one line when all
    ran on one, else each row marked with its machine's number."""
    if not records:
        raise DraftlineError("no stage timings recorded yet: they are written by stages `dvc repro` runs "
                             "(`make demo`)")
    machines = list(dict.fromkeys(record.machine for record in records))
    width = max(len("total"), *(len(record.stage) for record in records))
    lines = [f"{'stage':<{width}}  {'wall s':>8}  finished (UTC)"]
    for record in records:
        mark = f"  [{machines.index(record.machine) + 1}]" if len(machines) > 1 else ""
        lines.append(f"{record.stage:<{width}}  {record.wall_s:>8.1f}  {record.finished:%Y-%m-%d %H:%M:%S}{mark}")
    lines.append(f"{'total':<{width}}  {sum(record.wall_s for record in records):>8.1f}")
    if len(machines) == 1:
        lines.append(f"measured on: {machines[0]}")
    else:
        lines.extend(f"[{number}] {machine}" for number, machine in enumerate(machines, 1))
    return "\n".join(lines)


def _run(params: StageParams, args: argparse.Namespace) -> None:
    print(timings_table(load_stage_times(Path(params.project.metrics_dir))))


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.cli import run_stage, stage_parser

    parser = stage_parser("draftline timings", "each stage's last wall time under `dvc repro`, and its machine")
    return run_stage(parser, StageParams, _run, argv)


if __name__ == "__main__":
    sys.exit(main())
