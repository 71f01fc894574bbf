"""A stage that fails under real `dvc repro` exits non-zero and leaves every output as it was: DVC does not
delete the previous outputs before running it (they are `persist: true`), and the stage had not replaced
them yet. One case per stage; each is made stale by a params edit and fails on its input (the recorded
outputs are placeholders, not artifacts)."""

from pathlib import Path

import pytest
import yaml

from tests.support.dvc_workspace import DVC, copy_project, dvc, outputs, record_up_to_date, stale_stages

pytestmark = pytest.mark.skipif(not DVC.exists(), reason="dvc is not installed next to this interpreter")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("failed_stage") / "repo"
    copy_project(repo)
    record_up_to_date(repo)
    return repo


def _snapshot(repo: Path) -> dict[str, bytes]:
    files = [file for out in outputs(repo) for file in ([out] if out.is_file() else sorted(out.rglob("*")))]
    return {str(file.relative_to(repo)): file.read_bytes() for file in files if file.is_file()}


def _set(params: dict, dotted: str, value: object) -> None:
    *parents, key = dotted.split(".")
    for name in parents:
        params = params.setdefault(name, {})
    params[key] = value


@pytest.mark.parametrize(("stage", "key", "value"), [
    ("bootstrap_verifier", "verifier", {"source": "hf", "name_or_path": "/nonexistent/verifier"}),  # data
    ("build_corpus", "corpus.max_new_tokens", 32),                                                  # data
    ("train_ar", "train.ar.trainer.max_steps", 7),                                                  # train
    ("train_block", "train.block.trainer.max_steps", 7),                                            # train
    ("export", "export.atol", 0.001),                                                               # export
    ("evaluate", "evaluate.top_p", 0.9),                                                            # evaluate
    ("serve_check", "serve_check.max_tau_gap", 0.2),                                                # serving
    ("promote", "promote.min_tau", 1.1),                                                            # registry
])
def test_a_failed_stage_keeps_the_previous_outputs(workspace, stage, key, value):
    params_path = workspace / "params.yaml"
    original = params_path.read_text()
    params = yaml.safe_load(original)
    _set(params, key, value)
    before = _snapshot(workspace)
    params_path.write_text(yaml.safe_dump(params))
    try:
        result = dvc(workspace, "repro", "--single-item", stage, check=False)
        assert result.returncode != 0, result.stdout
        assert _snapshot(workspace) == before
        assert stage in stale_stages(workspace)  # DVC did not record the failed run
    finally:
        params_path.write_text(original)
