"""The dtype benchmark's scratch projects: the project's params with only what the benchmark changes, valid for
the schema (a renamed key would otherwise surface only after minutes of extraction)."""

from __future__ import annotations

from pathlib import Path

import yaml

from train.bench_feature_dtypes import DTYPES, scratch_params

REPO = Path(__file__).resolve().parents[2]


def test_scratch_params_change_only_dtype_paths_offline_and_the_quick_run_caps(tmp_path):
    project = yaml.safe_load((REPO / "params.yaml").read_text())
    for dtype in DTYPES:
        params = scratch_params(project, tmp_path / dtype, dtype, steps=6, prompts=2)
        assert params["features"]["dtype"] == dtype
        assert params["project"]["artifacts_dir"] == str(tmp_path / dtype / "artifacts")
        assert params["tracking"]["uri"] == f"sqlite:///{tmp_path / dtype / 'mlflow.db'}"
        for section in params["train"].values():
            assert section["features"] == "offline" and section["trainer"]["max_steps"] == 6
            assert section["trainer"]["warmup_steps"] <= 6 // 4
        assert params["evaluate"]["prompts_per_domain"] == 2 and params["evaluate"]["timing_repeats"] == 1
        assert params["verifier"] == project["verifier"] and params["corpus"] == project["corpus"]
    full = scratch_params(project, tmp_path, "float8_e4m3", steps=None, prompts=None)
    assert full["train"]["block"]["trainer"] == project["train"]["block"]["trainer"]  # the project's own recipe
