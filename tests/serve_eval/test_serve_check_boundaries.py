"""serve_check measures only this project's files, and only engines that ran to the end.

- An engine killed by a signal is no evidence about a drafter: the stage fails with one line naming the
  signal, and serving.json keeps its last result.
- What vLLM would serve must be the export's own files as its manifest hashed them, the drafter from inside
  the export dir and the verifier this project records; an export dir moved out of the project and
  symlinked back is refused too. Each refusal is one line, before any engine starts.

The serving environment is a stand-in interpreter: it reports a vLLM version, and any engine it is asked to
run kills itself with SIGKILL (as the kernel's OOM killer would).
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from export.export import export_serving
from export.manifest import file_table
from pipeline.drafters.kinds import KINDS
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from serve_eval import serve_check
from tests.support.workspace import tiny_workspace

PREVIOUS = '{"drafters": {"ar": {"status": "passed"}}}\n'
KILLED_ENGINE = """#!/bin/sh
case "$2" in
  *lineage.py) echo '{"python": "3.11", "vllm": "0.32.0"}' ;;
  *) kill -9 $$ ;;
esac
"""


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project with the ar drafter exported (vllm.json, launch.md, serving/ and a manifest of them), a
    previous serving.json, and a serving environment whose engines get killed."""
    root = tiny_workspace(tmp_path / "project")
    paths = ArtifactPaths(root / "artifacts", root / "metrics", root / "plots")
    export_dir = paths.export("ar")
    export_serving(KINDS["ar"], paths.drafter("ar"), export_dir, export_dir, str(paths.verifier.resolve()),
                   AutoTokenizer.from_pretrained(paths.verifier), paths.root)
    _write_manifest(export_dir)
    (root / "params.yaml").write_text(json.dumps({"export": {"kinds": ["ar"]},
                                                  "serve_check": {"prompts_per_domain": 1, "max_new_tokens": 4}}))
    (root / "metrics").mkdir()
    (root / "metrics" / "serving.json").write_text(PREVIOUS)
    python = tmp_path / "serve-env" / "python"
    python.parent.mkdir()
    python.write_text(KILLED_ENGINE)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("DRAFTLINE_SERVE_PYTHON", str(python))
    monkeypatch.chdir(root)
    return root


def _write_manifest(export_dir: Path) -> None:
    (export_dir / "manifest.json").write_text(json.dumps({"files": file_table(export_dir)}))


def _one_line_failure(capsys, engines_started: bool = False) -> str:
    """The stage's error line; whether any engine was started before it (progress lines say so)."""
    capsys.readouterr()
    assert serve_check.main(["--params", "params.yaml"]) == 1
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]
    assert last.startswith("draftline: error: ") and "Traceback" not in err, err
    assert ("serve_check: vLLM" in err) is engines_started, err
    assert Path("metrics/serving.json").read_text() == PREVIOUS  # the last result stays
    return last


def test_an_engine_killed_by_a_signal_fails_the_stage_and_keeps_serving_json(project, capsys):
    err = _one_line_failure(capsys, engines_started=True)
    assert "killed by SIGKILL" in err and "out-of-memory" in err and "no output" not in err


def test_an_engine_that_exits_without_a_result_fails_the_stage(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'Illegal instruction' >&2\nexit 3\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    job = {"runs": [{"name": "single"}]}
    with pytest.raises(DraftlineError, match=r"exited with code 3 without a result \(Illegal instruction\)"):
        serve_check.run_engine(python, job, "ar", tmp_path, serve_check.ServeCheckConfig())


def _edit_vllm_json(export_dir: Path, field: str, value: str) -> None:
    path = export_dir / "vllm.json"
    job = json.loads(path.read_text())
    if field == "model":
        job["model"] = value
    else:
        job["speculative_config"]["model"] = value
    path.write_text(json.dumps(job))


@pytest.mark.parametrize("rehashed", [False, True])  # True: the manifest was edited to match
@pytest.mark.parametrize("field", ["model", "draft"])
def test_vllm_json_pointing_outside_the_project_is_refused(project, tmp_path, capsys, field, rehashed):
    export_dir = project / "artifacts" / "export" / "ar"
    outside = tmp_path / "outside"
    shutil.copytree(project / "artifacts" / ("verifier" if field == "model" else "export/ar/serving"), outside)
    _edit_vllm_json(export_dir, field, str(outside))
    if rehashed:
        _write_manifest(export_dir)
    err = _one_line_failure(capsys)
    if not rehashed:
        assert "vllm.json differs from" in err and "dvc repro export" in err
    elif field == "model":
        assert f"serves the verifier {outside}, not this project's" in err
    else:
        assert f"serves the ar drafter from {outside}, not from its export dir" in err


def test_a_file_the_manifest_does_not_list_is_refused(project, capsys):
    serving = project / "artifacts" / "export" / "ar" / "serving"
    (serving / "model-00002-of-00002.safetensors").write_bytes(b"weights vLLM would load too")
    err = _one_line_failure(capsys)
    assert "serving/model-00002-of-00002.safetensors, which its manifest.json does not list" in err


def test_an_export_moved_out_and_symlinked_back_is_refused(project, tmp_path, capsys):
    export_dir = project / "artifacts" / "export" / "ar"
    elsewhere = tmp_path / "elsewhere" / "ar"
    elsewhere.parent.mkdir()
    shutil.move(export_dir, elsewhere)
    export_dir.symlink_to(elsewhere, target_is_directory=True)
    err = _one_line_failure(capsys)
    assert f"resolves to {elsewhere}, outside {project}" in err


def test_a_launch_command_server_killed_by_a_signal_fails_the_stage(tmp_path):
    """launch.md's command served by a server that the kernel kills before it is ready: no drafter verdict."""
    from pipeline.server_process import EngineKilled
    from serve_eval.launch_check import serve_launch_command

    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nkill -9 $$\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    job = {"dtype": "float32", "max_model_len": 64, "seed": 0, "enforce_eager": True, "prompts": {}, "runs": []}
    with pytest.raises(EngineKilled, match="vllm serve was killed by SIGKILL"):
        serve_launch_command(python, ["python"], job, tmp_path / "launch.log", 30, {})
