"""A new kind needs its package and its registry entry, nothing else: a renamed copy of the AR kind (`ar2`)
in a copy of the repository shows up in the schema, `params check`, the CLI and the generated dvc.yaml."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def repo_with_ar2(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("fourth_kind") / "repo"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (REPO / name).is_file() and not name.startswith(("tests/", "docs/")):
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
    package = repo / "pipeline" / "drafters" / "ar2"
    shutil.copytree(repo / "pipeline" / "drafters" / "ar", package)
    for path in package.glob("*.py"):  # edits inside the new package only: its imports and its own name
        text = re.sub(r"\bpipeline\.drafters\.ar\b", "pipeline.drafters.ar2", path.read_text())
        path.write_text(re.sub(r'(name = |kind=|\()"ar"', r'\1"ar2"', text))
    registry = repo / "pipeline" / "drafters" / "registry.py"
    ar_import = "from pipeline.drafters.ar.spec import AR\n"
    text = registry.read_text().replace(ar_import, ar_import + "from pipeline.drafters.ar2.spec import AR as AR2\n")
    registry.write_text(text.replace("(AR, BLOCK, DSPARK, EAGLE3)", "(AR, BLOCK, DSPARK, EAGLE3, AR2)"))
    return repo


def _python(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=repo, capture_output=True, text=True, check=check,
                          env={"PYTHONPATH": str(repo), "PATH": str(Path(sys.executable).parent), "HF_HUB_OFFLINE": "1"})


def test_schema_and_params_check_take_the_new_section(repo_with_ar2):
    shown = _python(repo_with_ar2, "-m", "pipeline.cli", "params", "show").stdout
    assert "ar2" in yaml.safe_load(shown)["train"]
    params = repo_with_ar2 / "params.yaml"
    data = yaml.safe_load(params.read_text())
    data["train"]["ar2"] = {"draft_tokens": 2}
    params.write_text(yaml.safe_dump(data))
    assert _python(repo_with_ar2, "-m", "pipeline.cli", "params", "check").returncode == 0
    data["train"]["ar2"] = {"draft_tokenz": 2}
    params.write_text(yaml.safe_dump(data))
    refused = _python(repo_with_ar2, "-m", "pipeline.cli", "params", "check", check=False)
    assert refused.returncode != 0 and "train.ar2.draft_tokenz: unknown key" in refused.stderr
    data["train"]["ar2"] = {"draft_tokens": 2}  # the repo is shared: leave valid params for the dvc.yaml generator
    params.write_text(yaml.safe_dump(data))


def test_cli_offers_the_new_kind(repo_with_ar2):
    assert "ar2" in _python(repo_with_ar2, "-m", "pipeline.cli", "train", "--help").stdout
    assert "--drafter ar|block|dspark|eagle3|ar2" in _python(repo_with_ar2, "-m", "pipeline.cli", "--help").stdout


def test_generated_pipeline_trains_and_reads_the_new_kind(repo_with_ar2):
    _python(repo_with_ar2, "-m", "pipeline.dvc_pipeline")
    stages = yaml.safe_load((repo_with_ar2 / "dvc.yaml").read_text())["stages"]
    train = stages["train_ar2"]
    assert train["cmd"] == "python -m train.dispatch --drafter ar2" and "train.ar2" in train["params"]
    assert "pipeline/drafters/ar2/training.py" in train["deps"]
    assert "pipeline/drafters/ar/model.py" not in train["deps"]
    for reader in ("export", "evaluate", "serve_check", "promote"):
        assert "${project.artifacts_dir}/drafters/ar2" in stages[reader]["deps"], reader
    assert "pipeline/drafters/ar2/kind.py" in stages["export"]["deps"]
