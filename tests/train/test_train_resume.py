"""Crashes during training: a resumed run equals an uninterrupted one; damaged checkpoints and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from tests.support import REPO
from tests.support.training import assert_trained, run_train, write_params
from tests.support.workspace import make_artifacts
from train.trainer import FINGERPRINT_FILE, LAST_CHECKPOINT, resume_checkpoint

TOTAL_STEPS = 20
# 12 training rows in batches of 4: 3 batches an epoch, so the kill lands mid-epoch after a few epochs.
TRAINER = {"max_steps": TOTAL_STEPS, "checkpoint_every_n_steps": 5}


def _adam_steps(checkpoint: Path) -> int:
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    per_param = state["optimizer_states"][0]["state"]
    return int(next(iter(per_param.values()))["step"])


def _start_training(params_path: Path) -> subprocess.Popen:
    # paced: offline, the tiny drafter's steps take milliseconds, faster than the poll below sees a checkpoint
    paced = f"{REPO / 'tests' / 'support' / 'paced_steps'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MLFLOW_ENABLE_TELEMETRY": "false",
           "PYTHONPATH": paced}
    return subprocess.Popen(
        [sys.executable, "-m", "train.dispatch", "--drafter", "ar", "--params", str(params_path)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # A shell's background job (`make test &`, nohup) ignores SIGINT, the child inherits that and Python then
        # installs no KeyboardInterrupt handler: give the child the disposition a terminal's Ctrl-C meets.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for(process: subprocess.Popen, path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, "training ended before the checkpoint appeared"
        assert time.monotonic() < deadline, f"no {path.name} within {timeout:.0f} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_killed_and_resumed_run_equals_the_uninterrupted_one(tmp_path):
    killed_root, clean_root = tmp_path / "killed", tmp_path / "clean"
    for root in (killed_root, clean_root):
        root.mkdir()
        make_artifacts(root)
    params_path = write_params(killed_root, TRAINER)
    checkpoints = killed_root / "artifacts" / "checkpoints" / "ar"
    process = _start_training(params_path)
    _wait_for(process, checkpoints / "step000010.ckpt")
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = torch.load(checkpoints / LAST_CHECKPOINT, map_location="cpu", weights_only=False)["global_step"]
    assert 0 < killed_at < TOTAL_STEPS and killed_at % 3  # a checkpoint from the middle of an epoch
    assert not (killed_root / "artifacts" / "drafters" / "ar").exists()

    resumed = run_train(params_path)
    assert "resuming from" in resumed.stderr
    assert "marked 1 MLflow run(s) left RUNNING" in resumed.stderr
    resumed_info = assert_trained(killed_root, resumed, TOTAL_STEPS)
    # AdamW counts its own steps: only a restored optimizer state has seen all of them.
    assert _adam_steps(checkpoints / LAST_CHECKPOINT) == TOTAL_STEPS

    clean_info = assert_trained(clean_root, run_train(write_params(clean_root, TRAINER)), TOTAL_STEPS)
    assert resumed_info["tokens"] == clean_info["tokens"]  # the same batches, none twice, none skipped
    for key in ("val_loss", "train_loss"):
        assert resumed_info[key] == pytest.approx(clean_info[key], rel=1e-4, abs=1e-5), key
    assert resumed_info["top1_agreement"] == pytest.approx(clean_info["top1_agreement"], abs=1e-6)

    client = MlflowClient(f"sqlite:///{killed_root / 'mlflow.db'}")
    statuses = sorted(run.info.status for run in client.search_runs(
        [e.experiment_id for e in client.search_experiments()]))
    assert statuses == ["FINISHED", "KILLED"]


@pytest.mark.slow
def test_ctrl_c_exits_130_with_one_line(tmp_path):
    make_artifacts(tmp_path)
    process = _start_training(write_params(tmp_path, {**TRAINER, "max_steps": 400}))
    _wait_for(process, tmp_path / "artifacts" / "checkpoints" / "ar" / "step000005.ckpt")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "draftline: interrupted"
    assert "Traceback" not in err
    assert not (tmp_path / "artifacts" / "drafters" / "ar").exists()


def test_damaged_last_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, capsys):
    fingerprint = {"train.ar": {"x": 1}}
    (tmp_path / FINGERPRINT_FILE).write_text(json.dumps(fingerprint))
    torch.save({"global_step": 5}, tmp_path / "step000005.ckpt")
    torch.save({"global_step": 10}, tmp_path / "step000010.ckpt")
    intact = (tmp_path / "step000010.ckpt").read_bytes()
    (tmp_path / "step000010.ckpt").write_bytes(intact[: len(intact) // 2])  # killed mid-write
    (tmp_path / LAST_CHECKPOINT).write_bytes(b"")
    assert resume_checkpoint(tmp_path, fingerprint) == str(tmp_path / "step000005.ckpt")
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert f"checkpoint {tmp_path / LAST_CHECKPOINT} is damaged" in err

    (tmp_path / "step000005.ckpt").write_bytes(b"garbage")
    assert resume_checkpoint(tmp_path, fingerprint) is None
    assert "no intact checkpoint" in capsys.readouterr().err
