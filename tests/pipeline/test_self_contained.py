"""A project is self-contained: what it writes or serves resolves inside the project it runs in, through
symlinks too, unless params.yaml puts it elsewhere on purpose.

- MLflow: a copied project's store still names the original's `mlruns/` (MLflow records absolute artifact
  locations), or its `mlflow.db` is a symlink to the original's: training refuses before it logs anything.
- Artifact dirs: one moved out of the project and symlinked back is refused wherever a stage reaches it.
(Exports served by serve_check: tests/serve_eval/test_serve_check_boundaries.py.)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pipeline.config.project_config import ProjectConfig
from pipeline.config.stage_params import StageParams
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.training.params import TrainParams
from train.distill import distill

EXPERIMENT = "draftline"


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    """A finished project's MLflow store: the experiment training made, artifacts next to the database."""
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("original")
    MlflowClient(f"sqlite:///{root / 'mlflow.db'}").create_experiment(EXPERIMENT, artifact_location=str(root / "mlruns"))
    (root / "mlruns").mkdir(exist_ok=True)
    return root


def _train(monkeypatch, project: Path, **tracking) -> str:
    """Stage train_ar in `project` up to its first check past tracking: no verifier there."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(project)
    params = TrainParams.model_validate({"tracking": {"experiment": EXPERIMENT, **tracking}})
    with pytest.raises(DraftlineError) as caught:
        distill(params, "ar")
    return str(caught.value)


def test_a_copied_project_does_not_train_into_the_originals_mlruns(original, tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    error = _train(monkeypatch, copy)
    assert f"keeps artifacts in {original / 'mlruns'}, not next to {copy / 'mlflow.db'}" in error
    assert "\n" not in error


@pytest.mark.parametrize("linked", ["mlflow.db", "mlruns"])
def test_a_store_symlinked_to_another_projects_is_refused(original, tmp_path, monkeypatch, linked):
    copy = tmp_path / "copy"
    copy.mkdir()
    if linked == "mlruns":
        shutil.copy(original / "mlflow.db", copy / "mlflow.db")
    (copy / linked).symlink_to(original / linked)
    error = _train(monkeypatch, copy)
    assert f"resolve outside this project {copy}" in error and "set tracking.uri to it if you mean it" in error
    # named in params on purpose, the same store is used: tracking passes, and the next check speaks
    uri = f"sqlite:///{copy / 'mlflow.db'}"
    assert _train(monkeypatch, copy, uri=uri).startswith("no verifier at artifacts/verifier")


@pytest.mark.parametrize("directory", ["verifier", "export/ar", "drafters/block", "corpus"])
def test_an_artifact_dir_symlinked_outside_the_project_is_refused(tmp_path, monkeypatch, directory):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "artifacts" / directory).parent.mkdir(parents=True)
    elsewhere.mkdir()
    (project / "artifacts" / directory).symlink_to(elsewhere, target_is_directory=True)
    monkeypatch.chdir(project)
    paths = ArtifactPaths.from_params(StageParams())
    reach = {"verifier": lambda: paths.verifier, "export/ar": lambda: paths.export("ar"),
             "drafters/block": lambda: paths.drafter("block"), "corpus": lambda: paths.corpus}[directory]
    with pytest.raises(DraftlineError, match=f"resolves to {elsewhere}, outside {project}"):
        reach()
    assert paths.features == Path("artifacts/features")  # the others are where they belong


def test_output_dirs_configured_outside_on_purpose_are_used(tmp_path, monkeypatch):
    project, elsewhere = tmp_path / "project", tmp_path / "big-disk" / "artifacts"
    (elsewhere / "verifier").mkdir(parents=True)
    project.mkdir()
    monkeypatch.chdir(project)
    paths = ArtifactPaths.from_params(StageParams(project=ProjectConfig(artifacts_dir=str(elsewhere))))
    assert paths.verifier == elsewhere / "verifier"
    os.symlink(tmp_path, project / "metrics")  # a symlinked metrics dir is refused like an artifact dir
    with pytest.raises(DraftlineError, match="set project.metrics_dir to where it is"):
        ArtifactPaths.from_params(StageParams())
