"""dvc.yaml and the CLI agree with the code: every stage command is a runnable module with --help."""

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]
STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
FLOW = ["bootstrap_verifier", "build_corpus", "train_ar", "train_block", "export", "evaluate", "promote"]


def test_dvc_stages_cover_the_whole_flow():
    assert list(STAGES) == FLOW


@pytest.mark.parametrize("stage", FLOW)
def test_stage_command_is_a_module_with_main(stage):
    argv = shlex.split(STAGES[stage]["cmd"])
    assert argv[:2] == ["python", "-m"]
    spec = importlib.util.find_spec(argv[2])
    assert spec is not None, f"{stage}: module {argv[2]} does not exist"
    module = importlib.import_module(argv[2])
    assert callable(module.main)


@pytest.mark.parametrize("stage", FLOW)
def test_stage_code_deps_exist(stage):
    for dep in STAGES[stage].get("deps", []):
        if not dep.startswith(("artifacts/", "metrics/")):
            assert (REPO / dep).exists(), f"{stage}: dep {dep} does not exist"


@pytest.mark.parametrize("stage", FLOW)
def test_stage_params_are_schema_sections(stage):
    from pipeline.config import Params

    dumped = Params().model_dump()
    for key in STAGES[stage].get("params", []):
        node = dumped
        for part in key.split("."):
            assert part in node, f"{stage}: params key {key} is not in the schema"
            node = node[part]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_cli_command_has_help(command):
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", command, "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
