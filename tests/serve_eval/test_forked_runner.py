"""serve_check's engines forked from one vLLM import (`vllm_runner.py --fork-server`): each job runs in a
process of its own with its own log and result, a job that fails or dies leaves the server serving the next,
and a forked engine's output is a lone runner's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.serve_check_config import ServeCheckConfig
from pipeline.errors import DraftlineError
from pipeline.serving_venv import serve_python
from serve_eval import serve_check
from tests.support.tiny_models import tiny_qwen3, tiny_tokenizer

CONFIG = ServeCheckConfig()


def test_each_job_gets_its_own_process_log_and_result_and_a_broken_one_leaves_the_server_serving(tmp_path):
    """Without vLLM (this interpreter has none) every job reports vLLM's import error as its result; a JOB
    file that is not JSON ends its process with a traceback in its log, and the next job still runs."""
    job = {"model": "m", "runs": [{"name": "single"}]}
    with serve_check.forked_runner(Path(sys.executable), tmp_path, CONFIG) as forked:
        first = serve_check.run_engine(Path(sys.executable), job, "first", tmp_path, CONFIG, forked)
        broken = tmp_path / "broken.json"
        broken.write_text("{not json")
        assert forked.run(broken, tmp_path / "none.json", tmp_path / "broken.log", 30) == 1
        second = serve_check.run_engine(Path(sys.executable), job, "second", tmp_path, CONFIG, forked)
        server = forked.process
    assert server.returncode == 0  # served all three, then ended with its input
    assert first["error"] == second["error"] == "ModuleNotFoundError: No module named 'vllm'"
    assert not (tmp_path / "none.json").exists()
    assert "JSONDecodeError" in (tmp_path / "broken.log").read_text()


def test_a_job_past_its_time_is_killed_and_the_stage_reads_it_as_a_timeout(tmp_path, monkeypatch):
    """The forked engine is killed at the limit, as `subprocess.run(timeout=...)` kills a lone runner."""
    slow = tmp_path / "runner.py"
    # a stand-in fork server: answers `started`, then never `exited` until its child is gone
    slow.write_text("import os, sys, time\nfor line in sys.stdin:\n    pid = os.fork()\n    if pid == 0:\n"
                    "        time.sleep(60)\n        os._exit(0)\n    print('started', pid, flush=True)\n"
                    "    print('exited', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)\n")
    monkeypatch.setattr(serve_check, "RUNNER", slow)
    with serve_check.forked_runner(Path(sys.executable), tmp_path, CONFIG) as forked:
        with pytest.raises(subprocess.TimeoutExpired):
            forked.run(tmp_path / "job.json", tmp_path / "result.json", tmp_path / "job.log", 0.5)
        assert forked.process.poll() is None  # the server lives on; only the engine was killed


def test_a_fork_server_that_dies_fails_the_stage_in_one_line(tmp_path, monkeypatch):
    dead = tmp_path / "runner.py"
    dead.write_text("import sys\nsys.exit(3)\n")
    monkeypatch.setattr(serve_check, "RUNNER", dead)
    with serve_check.forked_runner(Path(sys.executable), tmp_path, CONFIG) as forked:
        with pytest.raises(DraftlineError, match="fork server answered '' instead of 'started' \\(exit code 3\\)"):
            serve_check.run_engine(Path(sys.executable), {"runs": []}, "ar", tmp_path, CONFIG, forked)


@pytest.mark.slow
@pytest.mark.skipif(serve_python() is None, reason="no serving environment: run `make serve-env`")
def test_a_forked_engine_generates_what_a_lone_runner_generates(tmp_path):
    tokenizer = tiny_tokenizer()
    verifier = tiny_qwen3(len(tokenizer), hidden_size=128, num_layers=2, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    verifier.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    prompts = {"code": [[5, 6, 7, 8], [9, 10, 11]]}
    job = {"model": str(tmp_path / "verifier"), "speculative_config": None, "prompts": prompts, "max_new_tokens": 8,
           "dtype": "float32", "seed": 0, "max_model_len": 64, "enforce_eager": True,
           "runs": [{"name": "greedy", "concurrency": 2, "temperature": 0.0, "top_k": 0, "top_p": 1.0}]}
    lone = serve_check.run_engine(serve_python(), job, "lone", tmp_path, CONFIG)
    with serve_check.forked_runner(serve_python(), tmp_path, CONFIG) as forked:
        forked_runs = [serve_check.run_engine(serve_python(), job, f"forked{i}", tmp_path, CONFIG, forked)
                       for i in range(2)]
    assert lone["error"] is None, lone["error"]
    outputs = lone["runs"]["greedy"]["code"]["outputs"]
    assert len(outputs) == 2 and all(len(ids) == 8 for ids in outputs)
    assert all(run["runs"]["greedy"]["code"]["outputs"] == outputs for run in forked_runs)
