"""A schema edit reruns only the stages that read the edited section: real `dvc status` on a copy of the
repository whose stages were recorded as up to date (`dvc commit` over placeholder outputs)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DVC = Path(sys.executable).with_name("dvc")
DIRS = {"${project.artifacts_dir}": "artifacts", "${project.metrics_dir}": "metrics", "${project.plots_dir}": "plots"}

pytestmark = pytest.mark.skipif(not DVC.exists(), reason="dvc is not installed next to this interpreter")


def _dvc(repo: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{DVC.parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([str(DVC), *args], cwd=repo, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _placeholder_outputs(repo: Path) -> None:
    for stage in yaml.safe_load((repo / "dvc.yaml").read_text())["stages"].values():
        for out in (out for key in ("outs", "metrics", "plots") for out in stage.get(key, [])):
            path = out if isinstance(out, str) else next(iter(out))
            for variable, value in DIRS.items():
                path = path.replace(variable, value)
            target = repo / path
            if target.suffix:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(path)
            else:
                target.mkdir(parents=True, exist_ok=True)
                (target / "placeholder").write_text(path)


@pytest.fixture(scope="module")
def recorded_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("stage_deps") / "repo"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (REPO / name).is_file() and not name.startswith("tests/"):
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _placeholder_outputs(repo)
    _dvc(repo, "commit", "-f", "-q")
    assert json.loads(_dvc(repo, "status", "--json")) == {}
    return repo


@pytest.mark.parametrize(("module", "old", "new", "stages"), [
    ("pipeline/config/promote_config.py", "floors for the named domains", "floors for the domains named here",
     {"promote"}),
    ("pipeline/config/serve_check_config.py", "skip vLLM's torch.compile warm-up", "no torch.compile warm-up",
     {"serve_check", "promote"}),
    ("pipeline/drafters/eagle3/config.py", "training-time test: the head", "training-time test: the EAGLE-3 head",
     # the kind's config module is also its model code's (export, evaluate and serve_check build the drafter),
     # and names the verifier layers extract_features stores for it
     {"extract_features", "train_ar", "train_block", "train_dspark", "train_eagle3", "export", "evaluate", "serve_check"}),
])
def test_a_schema_edit_marks_only_the_stages_that_read_it(recorded_repo, module, old, new, stages):
    path = recorded_repo / module
    original = path.read_text()
    assert old in original, f"{module} no longer says {old!r}; pick another line to edit"
    path.write_text(original.replace(old, new))
    try:
        changed = set(json.loads(_dvc(recorded_repo, "status", "--json")))
    finally:
        path.write_text(original)
    assert changed == stages


@pytest.mark.parametrize(("keys", "value", "stages"), [
    (("train", "block", "num_feature_layers"), 3, {"extract_features", "train_block"}),
    # a kind's other training params leave the (possibly terabytes of) extracted features alone
    (("train", "block", "trainer", "learning_rate"), 0.01, {"train_block"}),
])
def test_extract_features_reruns_on_the_params_its_layers_follow_from_only(recorded_repo, keys, value, stages):
    assert _stages_changed_by_params(recorded_repo, keys, value) == stages


@pytest.mark.parametrize(("keys", "value", "stages"), [
    (("promote", "temperatures"), [0.0], {"promote"}),
    # unset promote.temperatures, the gate decides at every temperature evaluate runs: a new list re-gates
    (("evaluate", "temperatures"), [0.0], {"evaluate", "serve_check", "promote"}),
])
def test_the_gate_temperatures_rerun_promote(recorded_repo, keys, value, stages):
    assert _stages_changed_by_params(recorded_repo, keys, value) == stages


def _stages_changed_by_params(repo: Path, keys: tuple[str, ...], value: object) -> set[str]:
    """The stages `dvc status` reports after params.yaml's `keys` is set to `value` (restored after)."""
    path = repo / "params.yaml"
    original = path.read_text()
    params = yaml.safe_load(original)
    node = params
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    path.write_text(yaml.safe_dump(params))
    try:
        return set(json.loads(_dvc(repo, "status", "--json")))
    finally:
        path.write_text(original)
