"""Files named in params.yaml that a stage reads (prompt files, a local external verifier) are DVC deps of
that stage: editing one makes real `dvc status` list the stage. (A stage run by DVC refuses to read one that
dvc.yaml does not list: tests/pipeline/test_stage_inputs_named.py.)"""

import json
from pathlib import Path

import pytest
import yaml

from pipeline.stage_inputs import dep_path
from tests.support.dvc_workspace import DVC, copy_project, record_up_to_date, regenerate, stale_stages

pytestmark = pytest.mark.skipif(not DVC.exists(), reason="dvc is not installed next to this interpreter")


def _with_inputs(params: dict, prompts: str, verifier: Path) -> dict:
    return {**params,
            "verifier": {**params["verifier"], "source": "hf", "name_or_path": str(verifier)},
            "corpus": {"sources": [{"kind": "file", "path": prompts, "domain": "text"}]}}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("dvc_inputs")
    repo, verifier = base / "repo", base / "external_verifier"
    copy_project(repo)
    verifier.mkdir()
    (verifier / "config.json").write_text('{"model_type": "qwen3"}\n')
    (repo / "prompts").mkdir()
    (repo / "prompts" / "mine.jsonl").write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    (repo / "params.yaml").write_text(yaml.safe_dump(_with_inputs(params, "./prompts/mine.jsonl", verifier)))
    regenerate(repo)
    record_up_to_date(repo)
    return repo, verifier


def test_generated_deps_name_the_inputs(workspace):
    repo, verifier = workspace
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    assert "prompts/mine.jsonl" in stages["build_corpus"]["deps"]
    assert str(verifier) in stages["bootstrap_verifier"]["deps"]


def test_editing_a_prompt_file_makes_build_corpus_stale(workspace):
    repo, _ = workspace
    prompts = repo / "prompts" / "mine.jsonl"
    original = prompts.read_text()
    prompts.write_text(json.dumps({"prompt": "class Stack:"}) + "\n")
    try:
        assert stale_stages(repo) == {"build_corpus"}
    finally:
        prompts.write_text(original)


def test_editing_an_external_verifier_makes_bootstrap_verifier_stale(workspace):
    repo, verifier = workspace
    weights = verifier / "model.safetensors"
    weights.write_bytes(b"new weights")
    try:
        assert stale_stages(repo) == {"bootstrap_verifier"}
    finally:
        weights.unlink()


def test_dep_paths_are_relative_inside_the_project_and_absolute_outside(tmp_path):
    assert dep_path("./data/../prompts/a.jsonl", tmp_path) == "prompts/a.jsonl"
    assert dep_path(str(tmp_path.parent / "b.jsonl"), tmp_path) == str(tmp_path.parent / "b.jsonl")
