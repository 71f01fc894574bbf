"""serve_check fails the stage, not the drafters, when its environment or the vLLM runner is at fault:
a missing or broken serving environment, or a runner result that is neither an error nor the runs asked
for, is one line and a non-zero exit, and serving.json keeps its last result. A skip on a limit of
vLLM's CPU build says how to get the check, or what declining it gives up."""

import json
import stat
from pathlib import Path

import pytest
import yaml

from pipeline.config.serve_check_config import ServeCheckConfig
from pipeline.errors import DraftlineError
from serve_eval import serve_check

PASSED = '{"drafters": {"ar": {"status": "passed"}}}\n'


def _stage(tmp_path: Path) -> tuple[list[str], Path]:
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"project": {
        "artifacts_dir": str(tmp_path / "artifacts"), "metrics_dir": str(tmp_path / "metrics"),
        "plots_dir": str(tmp_path / "plots")}}))
    serving = tmp_path / "metrics" / "serving.json"
    serving.parent.mkdir()
    serving.write_text(PASSED)
    return ["--params", str(tmp_path / "params.yaml")], serving


@pytest.mark.parametrize("python", ["/nonexistent/python", "/bin/false"])
def test_a_missing_or_broken_serving_env_fails_the_stage_and_keeps_serving_json(tmp_path, monkeypatch, capsys,
                                                                                 python):
    argv, serving = _stage(tmp_path)
    monkeypatch.setenv("DRAFTLINE_SERVE_PYTHON", python)
    assert serve_check.main(argv) != 0
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and python in error and "make serve-env" in error
    assert serving.read_text() == PASSED


def _fake_python(tmp_path: Path, result: str) -> Path:
    """Stands in for the serve env's interpreter: writes `result` where the runner would write its own."""
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\nprintf '%s' '{result}' > \"$4\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


JOB = {"runs": [{"name": "single"}, {"name": "batched"}]}


@pytest.mark.parametrize("result", ['{"engine_start_s": 1.0}', '{"runs": {"single": {}}}', "not json"])
def test_a_malformed_runner_result_is_one_line(tmp_path, result):
    with pytest.raises(DraftlineError, match="vLLM runner's result") as caught:
        serve_check.run_engine(_fake_python(tmp_path, result), JOB, "ar", tmp_path, ServeCheckConfig())
    assert "\n" not in str(caught.value)


def test_a_well_formed_runner_result_is_returned(tmp_path):
    runs = {"single": {"code": {}}, "batched": {"code": {}}}
    got = serve_check.run_engine(_fake_python(tmp_path, json.dumps({"runs": runs})), JOB, "ar", tmp_path,
                                 ServeCheckConfig())
    assert got["runs"] == runs
    error = serve_check.run_engine(_fake_python(tmp_path, '{"error": "RuntimeError: x"}'), JOB, "ar", tmp_path,
                                   ServeCheckConfig())
    assert error["error"] == "RuntimeError: x"


def test_a_cpu_build_skip_says_what_to_do():
    status, reason = serve_check.classify_error("RuntimeError: Unsupported CPU attention configuration: head_dim=8")
    assert status == "skipped"
    assert "head_dim=8" in reason and "GPU build of vLLM" in reason and "serve_check.required: false" in reason
    assert serve_check.classify_error("KeyError: 'fc.weight'") == ("failed", "KeyError: 'fc.weight'")
