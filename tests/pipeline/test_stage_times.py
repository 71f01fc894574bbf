"""Stage wall times: a stage `dvc repro` runs records one (a stage run by hand does not), and
`draftline timings` prints them as a table with the machine they were measured on."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from pipeline import stage_times
from pipeline.cli import run_stage, stage_parser
from pipeline.config.stage_params import StageParams
from pipeline.errors import DraftlineError
from pipeline.stage_times import STAGE_TIMES_DIR, StageTime

EPYC = "AMD EPYC, 2 cores, avx2 avx512f avx512_bf16; bf16 matmul native (...)"
XEON = "Intel Xeon, 2 cores, avx2; bf16 matmul not native (...)"


@pytest.fixture
def params(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"project": {"metrics_dir": str(tmp_path / "metrics")}}))
    return path


def write_records(metrics, rows: list[tuple[str, float, int, str]]) -> None:
    """(stage, wall s, finishing minute, machine) each, as the stages write them."""
    (metrics / STAGE_TIMES_DIR).mkdir(parents=True)
    for stage, wall_s, minute, machine in rows:
        record = StageTime(stage=stage, wall_s=wall_s, machine=machine,
                           finished=datetime(2026, 12, 5, 17, minute, tzinfo=timezone.utc))
        (metrics / STAGE_TIMES_DIR / f"{stage}.json").write_text(record.model_dump_json())


def test_the_table_lists_stages_in_the_order_they_finished_with_a_total_and_the_machine(params, capsys):
    write_records(params.parent / "metrics", [("train_block", 105.25, 20, EPYC), ("bootstrap_verifier", 500.0, 9, EPYC),
                                              ("build_corpus", 60.5, 11, EPYC)])
    assert stage_times.main(["--params", str(params)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:5]] == [["bootstrap_verifier", "500.0"], ["build_corpus", "60.5"],
                                                         ["train_block", "105.2"], ["total", "665.8"]]
    assert "2026-12-05 17:20:00" in lines[3]
    assert lines[5:] == [f"measured on: {EPYC}"]


def test_records_from_two_machines_are_each_marked_with_theirs(params, capsys):
    write_records(params.parent / "metrics", [("build_corpus", 60.0, 1, EPYC), ("train_block", 300.0, 2, XEON)])
    assert stage_times.main(["--params", str(params)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith("[1]") and lines[2].endswith("[2]")
    assert lines[-2:] == [f"[1] {EPYC}", f"[2] {XEON}"]


def test_no_records_or_a_damaged_one_is_one_line(params, capsys):
    assert stage_times.main(["--params", str(params)]) == 1
    assert capsys.readouterr().err.strip() == ("draftline: error: no stage timings recorded yet: they are written "
                                               "by stages `dvc repro` runs (`make demo`)")
    write_records(params.parent / "metrics", [("build_corpus", 60.0, 1, EPYC)])
    (params.parent / "metrics" / STAGE_TIMES_DIR / "export.json").write_text("{}")
    assert stage_times.main(["--params", str(params)]) == 1
    captured = capsys.readouterr()
    assert not captured.out and len(captured.err.splitlines()) == 1 and "export.json is not a stage timing" in captured.err


@pytest.mark.parametrize("under_dvc", [True, False])
def test_a_stage_dvc_runs_records_its_time_and_machine(params, monkeypatch, under_dvc):
    monkeypatch.setattr("pipeline.machine.machine_line", lambda: EPYC)
    monkeypatch.setattr("pipeline.stage_times.process_wall_s", lambda entered: 12.34)
    if under_dvc:
        monkeypatch.setenv("DVC_STAGE", "train_block")
    else:
        monkeypatch.delenv("DVC_STAGE", raising=False)
    assert run_stage(stage_parser("t", "t"), StageParams, lambda *_: None, ["--params", str(params)]) == 0
    records = stage_times.load_stage_times(params.parent / "metrics")
    if not under_dvc:
        assert records == []
        return
    [record] = records
    assert (record.stage, record.wall_s, record.machine) == ("train_block", 12.3, EPYC)


def test_a_stages_wall_time_counts_from_its_process_start():
    """Imports before the stage's code runs (torch: seconds) are the stage's time too."""
    code = ("import time; time.sleep(1.5); from pipeline.stage_times import process_wall_s; "
            "print(process_wall_s(time.time()))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[2])
    assert 1.5 <= float(result.stdout) < 30


def test_a_failed_stage_records_nothing(params, monkeypatch):
    monkeypatch.setenv("DVC_STAGE", "train_block")

    def fail(*_):
        raise DraftlineError("no corpus")

    assert run_stage(stage_parser("t", "t"), StageParams, fail, ["--params", str(params)]) == 1
    assert not (params.parent / "metrics" / STAGE_TIMES_DIR).exists()
