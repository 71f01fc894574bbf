"""A copy of the project as a real DVC workspace, for tests that run `dvc status` / `dvc repro` on it."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DVC = Path(sys.executable).with_name("dvc")
DIRS = {"${project.artifacts_dir}": "artifacts", "${project.metrics_dir}": "metrics", "${project.plots_dir}": "plots"}


def env(repo: Path) -> dict:
    """The venv's tools first, and the copy's code (not the editable install's) for stage commands."""
    return {**os.environ, "PATH": f"{DVC.parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(repo)}


def dvc(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(DVC), *args], cwd=repo, capture_output=True, text=True, env=env(repo), timeout=600)
    assert not check or result.returncode == 0, result.stderr
    return result


def stale_stages(repo: Path) -> set[str]:
    return set(json.loads(dvc(repo, "status", "--json").stdout))


def copy_project(repo: Path) -> None:
    """The tracked and to-be-committed files, tests left out, in a fresh git repository."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        if (REPO / name).is_file() and not name.startswith("tests/"):
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)


def regenerate(repo: Path) -> None:
    subprocess.run([sys.executable, "-m", "pipeline.dvc_pipeline"], cwd=repo, env=env(repo), check=True)


def outputs(repo: Path) -> list[Path]:
    """Every output path dvc.yaml declares, in the copy."""
    found = []
    for stage in yaml.safe_load((repo / "dvc.yaml").read_text())["stages"].values():
        for out in (out for key in ("outs", "metrics", "plots") for out in stage.get(key, [])):
            path = out if isinstance(out, str) else next(iter(out))
            for variable, value in DIRS.items():
                path = path.replace(variable, value)
            found.append(repo / path)
    return found


def placeholder_outputs(repo: Path) -> None:
    for target in outputs(repo):
        if target.suffix:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"previous {target.name}\n")
        else:
            target.mkdir(parents=True, exist_ok=True)
            (target / "placeholder").write_text(f"previous {target.name}\n")


def record_up_to_date(repo: Path) -> None:
    """Record every stage as done over the placeholders, so only later edits make stages stale."""
    placeholder_outputs(repo)
    dvc(repo, "commit", "-f", "-q")
    assert stale_stages(repo) == set()
