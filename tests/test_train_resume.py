"""Kill training with SIGKILL after a checkpoint, re-run: global step and optimizer state continue."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.test_train_ar import REPO, assert_trained, make_artifacts, run_train, write_params


def _adam_steps(checkpoint: Path) -> int:
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    per_param = state["optimizer_states"][0]["state"]
    return int(next(iter(per_param.values()))["step"])


@pytest.mark.slow
def test_kill_and_resume(tmp_path):
    make_artifacts(tmp_path)
    total = 20
    params_path = write_params(tmp_path, {"max_steps": total, "checkpoint_every_n_steps": 5})
    checkpoints = tmp_path / "artifacts" / "checkpoints" / "ar"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MLFLOW_ENABLE_TELEMETRY": "false"}
    process = subprocess.Popen(
        [sys.executable, "-m", "train.stage", "--drafter", "ar", "--params", str(params_path)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (checkpoints / "step000010.ckpt").exists():
        assert process.poll() is None, "training ended before the first checkpoints"
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    time.sleep(0.2)
    killed_at = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert 10 <= killed_at < total
    assert not (tmp_path / "artifacts" / "drafters" / "ar").exists()

    result = run_train(params_path)
    assert "resuming from" in result.stderr
    assert_trained(tmp_path, result, total)
    final = checkpoints / "last.ckpt"
    assert torch.load(final, map_location="cpu", weights_only=False)["global_step"] == total
    # AdamW counts its own steps: only a restored optimizer state has seen all of them.
    assert _adam_steps(final) == total
