"""Failures that were tracebacks, each now one line, and a stage that dies with the `dvc repro` that started it.

The stage runner (`pipeline.cli.run_stage`) is exercised in real child processes where the case is about
processes, signals or file descriptors; the OS errors themselves come from the OS where it can produce them here.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import SafetensorError

from pipeline.cli import run_stage, stage_parser
from pipeline.config.stage_params import StageParams
from pipeline.drafters import onnx_io
from pipeline.errors import DraftlineError
from pipeline.promote import registry_cmd

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# A stage that sleeps: what `dvc repro` runs, reduced to the runner.
SLEEPING_STAGE = ("import sys, time; from pipeline.cli import run_stage, stage_parser; "
                  "from pipeline.config.stage_params import StageParams; "
                  "print('started', flush=True); "
                  "sys.exit(run_stage(stage_parser('t', 't'), StageParams, lambda p, a: time.sleep(120), "
                  "['--params', sys.argv[1]]))")


@pytest.fixture
def params(tmp_path) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text("{}\n")
    return path


def _stage(params: Path, run, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = run_stage(stage_parser("t", "t"), StageParams, run, ["--params", str(params)])
    return code, capsys.readouterr().err.strip()


def test_a_path_through_a_file_is_one_line(tmp_path, params, capsys):
    """A checkpoint path that is a file (NotADirectoryError) named, not a traceback."""
    (tmp_path / "checkpoint").write_text("not a directory")
    code, err = _stage(params, lambda p, a: (tmp_path / "checkpoint" / "config.json").read_text(), capsys)
    assert code == 1 and "\n" not in err and "Traceback" not in err
    assert f"{tmp_path / 'checkpoint' / 'config.json'}: part of this path is a file" in err


@pytest.mark.parametrize("number, expected", [
    (errno.EROFS, "cannot write artifacts/export/ar"),
    (errno.ENOSPC, "no space left on the disk holding artifacts/export/ar"),
])
def test_read_only_or_full_disk_is_one_line(params, capsys, number, expected):
    def run(p, a):
        raise OSError(number, os.strerror(number), "artifacts/export/ar")
    code, err = _stage(params, run, capsys)
    assert code == 1 and "\n" not in err and expected in err


def test_stdout_on_a_full_device_is_one_line(params):
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "pipeline.params_cmd", "show", "--params", str(params)],
                                stdout=full, stderr=subprocess.PIPE, text=True, env=ENV, cwd=REPO, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == ("draftline: error: no space left on the disk holding standard output (No space "
                                     "left on device); free space there (`df -h`) and rerun")


def test_tracking_uri_without_its_driver_is_one_line(tmp_path, capsys):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"tracking": {"uri": "postgresql://user:secret@db.example/mlflow"}}))
    capsys.readouterr()
    assert registry_cmd.main(["--params", str(path), "list"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs the database driver 'psycopg" in err and "secret" not in err


def test_a_full_disk_during_onnx_export_names_the_disk(tmp_path, monkeypatch):
    def export(*args, **kwargs):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "raw.onnx"))
        except OSError as error:
            raise RuntimeError("Failed to export the model") from error  # how dynamo wraps it

    monkeypatch.setattr(torch.onnx, "export", export)
    spec = onnx_io.IOSpec((onnx_io.TensorSpec("x", "float32", ("batch",)),),
                          (onnx_io.TensorSpec("y", "float32", ("batch",)),))
    with pytest.raises(DraftlineError) as info:
        onnx_io.export_onnx(torch.nn.Identity(), spec, {"x": torch.zeros(1)}, tmp_path, opset=18, exporter="dynamo")
    assert "no space left on the disk holding" in str(info.value) and "exporter" not in str(info.value)


def _started(process: subprocess.Popen) -> None:
    assert process.stdout.readline().strip() == "started"
    time.sleep(0.5)  # into run(): the runner's handler is installed before it


def test_sigterm_exits_143_with_one_line(params):
    process = subprocess.Popen([sys.executable, "-c", SLEEPING_STAGE, str(params)], env=ENV, cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _started(process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143 and err.strip() == "draftline: terminated (SIGTERM)"


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


# The parent: starts the stage as DVC does (its own child, the environment DVC gives it), reports the
# stage's pid, then waits on it until it is killed itself.
PARENT = ("import os, subprocess, sys; "
          "child = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], env=os.environ, "
          "stdout=subprocess.PIPE, text=True); "
          "child.stdout.readline(); print(child.pid, flush=True); child.wait()")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("under_dvc", [True, False])
def test_a_stage_dies_with_the_dvc_that_started_it(params, under_dvc):
    env = {**ENV, "DVC_STAGE": "evaluate"} if under_dvc else {k: v for k, v in ENV.items() if k != "DVC_STAGE"}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, SLEEPING_STAGE, str(params)], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    stage_pid = int(parent.stdout.readline())
    time.sleep(0.5)
    parent.send_signal(signal.SIGTERM)  # `kill -TERM` of dvc repro
    parent.wait(timeout=30)
    try:
        # under DVC the stage goes with it; started by hand (`nohup draftline ... &`) it outlives its parent
        assert _gone(stage_pid, 10) is under_dvc
    finally:
        if not under_dvc:
            os.kill(stage_pid, signal.SIGKILL)


def test_torch_saves_failed_write_is_one_line_naming_the_likely_cause(params, capsys, tmp_path):
    """torch.save on a full disk (a DeepSpeed checkpoint, a features shard) raises a RuntimeError without the errno."""
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root): the real full-disk error cannot be made")
    try:
        def run(p, a):
            torch.save({"w": torch.zeros(100_000)}, full / "x.ckpt")
        code, err = _stage(params, run, capsys)
    finally:
        subprocess.run(["umount", str(full)], check=False)
    assert code == 1 and err.startswith("draftline: error: an output of this stage: torch's file writer failed") \
        and "df -h" in err and "\n" not in err.strip(), err


def test_a_full_disk_behind_a_librarys_own_error_is_one_line(params, capsys):
    """safetensors reports a full disk as its own error type, in words: still the full-disk line, no traceback."""
    def run(p, a):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    code, err = _stage(params, run, capsys)
    assert code == 1 and err == ("draftline: error: no space left on the disk holding an output of this stage (No "
                                 "space left on device); free space there (`df -h`) and rerun")
