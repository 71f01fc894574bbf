"""Running the training stage on a tiny workspace (`tests.support.workspace.make_artifacts`) and checking
what it saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from transformers import AutoModelForCausalLM

from pipeline.config.schema import parse_all
from tests.support import REPO
from tests.support.features import FEATURES_PARAMS


def write_params(root: Path, trainer: dict, ar: dict | None = None) -> Path:
    """A params.yaml pointing every output under `root`, with tiny AR drafter settings."""
    data = {
        "project": {"artifacts_dir": str(root / "artifacts"), "metrics_dir": str(root / "metrics"),
                    "plots_dir": str(root / "plots")},
        "train": {"ar": {"num_layers": 1, "num_heads": 4, "num_kv_heads": 2,
                         "loss": {"fkl": 1.0, "ce": 0.1},
                         "trainer": {"batch_size": 4, "learning_rate": 0.01, "warmup_steps": 2,
                                     "val_every_n_steps": 1000, **trainer},
                         **(ar or {})}},
        "features": FEATURES_PARAMS,
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}"},
    }
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    parse_all(data)  # fail here, not in a subprocess, on a bad test config
    return path


def run_train(params_path: Path, timeout: float = 170) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MLFLOW_ENABLE_TELEMETRY": "false"}
    return subprocess.run(
        [sys.executable, "-m", "train.dispatch", "--drafter", "ar", "--params", str(params_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )


def assert_trained(root: Path, result: subprocess.CompletedProcess, steps: int) -> dict:
    assert result.returncode == 0, result.stderr[-4000:]
    drafter_dir = root / "artifacts" / "drafters" / "ar"
    info = json.loads((drafter_dir / "training.json").read_text())
    assert info["steps"] == steps
    assert info["val_loss"] < info["untrained_val_loss"], info
    assert info["lineage"]["verifier_id"].startswith("tiny-test-")
    model = AutoModelForCausalLM.from_pretrained(drafter_dir)
    assert model.config.num_hidden_layers == 1
    assert (drafter_dir / "tokenizer.json").is_file()
    return info
