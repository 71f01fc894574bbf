"""serve_check's launch-command mode, without vLLM: launch.md's line for each build from one argument list,
the check that launch.md shows it, the /metrics counters, a command that does not start, the agreement
with the in-process run, and the clear reason for vLLM CPU's top_k crash."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pipeline.config.serve_check_config import ServeCheckConfig
from pipeline.drafters.served_checks import vllm_section
from pipeline.errors import DraftlineError
from pipeline.vllm_launch import API_SERVER_MODULE, command_line, cpu_command, gpu_command
from serve_eval import launch_check, serve_check

SPEC = {"method": "eagle3", "model": "/exp/eagle3/serving", "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic"}
JOB = {"model": "/models/my verifier", "speculative_config": SPEC, "dtype": "float32", "max_model_len": 120, "seed": 0,
       "enforce_eager": True, "max_new_tokens": 8, "prompts": {"code": [[1, 2, 3]]}, "runs": []}


def test_both_builds_lines_come_from_one_argument_list_and_launch_md_shows_them(tmp_path):
    gpu, cpu = gpu_command(JOB["model"], SPEC), cpu_command(JOB["model"], SPEC)
    assert gpu[:3] == ["vllm", "serve", JOB["model"]]
    assert cpu[:5] == ["python", "-m", API_SERVER_MODULE, "--model", JOB["model"]]
    assert gpu[3:] == cpu[5:] == ["--speculative-config", json.dumps(SPEC, sort_keys=True)]
    assert command_line(cpu).startswith("python -m vllm.entrypoints.openai.api_server --model '/models/my verifier' ")
    (tmp_path / "launch.md").write_text(vllm_section(JOB["model"], SPEC))
    for cpu_build, argv in ((True, cpu), (False, gpu)):
        assert launch_check.launch_argv(tmp_path, JOB, cpu_build) == argv


def test_a_launch_md_that_does_not_show_the_command_fails_with_re_export(tmp_path):
    (tmp_path / "launch.md").write_text(vllm_section(JOB["model"], {**SPEC, "num_speculative_tokens": 3}))
    with pytest.raises(DraftlineError, match=r"launch.md does not show the command serve_check runs .*dvc repro export"):
        launch_check.launch_argv(tmp_path, JOB, True)


def test_the_server_runs_launch_mds_argv_from_the_serving_env_with_the_in_process_engine_settings():
    python = Path("/venv/bin/python")
    cpu = launch_check.server_argv(cpu_command(JOB["model"], SPEC), python, 8123, JOB)
    assert cpu[0] == "/venv/bin/python" and cpu[1:7] == cpu_command(JOB["model"], SPEC)[1:]
    assert cpu[7:] == ["--host", "127.0.0.1", "--port", "8123", "--dtype", "float32", "--max-model-len", "120",
                       "--seed", "0", "--enforce-eager", "--generation-config", "vllm"]
    assert launch_check.server_argv(gpu_command(JOB["model"], SPEC), python, 8123, JOB)[0] == "/venv/bin/vllm"


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 48.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 1.0
"""


def test_metrics_counters_are_read_as_the_in_process_runner_reads_them():
    counters = launch_check.parse_counters(METRICS)
    assert counters == {serve_check.DRAFTS: 12, serve_check.DRAFT_TOKENS: 48, serve_check.ACCEPTED: 20,
                        serve_check.PER_POSITION: [11, 6]}
    before = {serve_check.DRAFTS: 2, serve_check.DRAFT_TOKENS: 8, serve_check.ACCEPTED: 5, serve_check.PER_POSITION: [3]}
    assert launch_check.counter_delta(counters, before)[serve_check.PER_POSITION] == [8, 6]


def test_a_command_that_does_not_start_fails_with_its_first_error_line(tmp_path):
    """Here the interpreter has no vLLM: the server exits at once and its reason is the drafter's."""
    argv = cpu_command(JOB["model"], SPEC)
    result = launch_check.serve_launch_command(Path(sys.executable), argv, JOB, tmp_path / "ar.launch.log", 60,
                                               serve_check.engine_env(ServeCheckConfig()))
    assert result["error"].startswith("ModuleNotFoundError: No module named 'vllm'")
    log = tmp_path / "warn.log"
    log.write_text("(EngineCore pid=1) WARNING x [base.py:380] ValueError: Tokenizer not available\n"
                   "(EngineCore pid=1) ERROR y [core.py:9] RuntimeError: max(): Expected reduction dim\nTraceback\n")
    assert launch_check.first_error_line(log) == "RuntimeError: max(): Expected reduction dim"


def domain(outputs, drafts, accepted, per_pos):
    return {"outputs": outputs, "wall_s": 1.0, "tokens": sum(map(len, outputs)),
            "counters": {serve_check.DRAFTS: drafts, serve_check.DRAFT_TOKENS: 3 * drafts,
                         serve_check.ACCEPTED: accepted, serve_check.PER_POSITION: per_pos}}


def test_the_launch_run_agrees_with_the_in_process_run_or_fails_the_drafter():
    in_process = {"runs": {"single": {"code": domain([[5, 6]], 10, 15, [8, 5, 2])},
                           "T=0.8": {"code": domain([[7, 8]], 10, 10, [6, 3, 1])}}}
    same = {"runs": {"single": {"code": domain([[5, 6]], 10, 15, [8, 5, 2])},
                     "T=0.8": {"code": domain([[9, 9]], 10, 12, [7, 4, 1])}}}  # sampled: other tokens, within noise
    assert serve_check.agreement(same, in_process, 3, 0.05, 3.0) == []
    off = {"runs": {"single": {"code": domain([[5, 7]], 10, 18, [9, 6, 3])},
                    "T=0.8": {"code": domain([[7, 8]], 10, 30, [10, 10, 10])}}}
    reasons = serve_check.agreement(off, in_process, 3, 0.05, 3.0)
    assert reasons[0] == "code single: greedy outputs differ from the in-process run"
    assert reasons[1] == "code single: tau 2.800 vs in-process 2.500 (gap 12.0% > serve_check.max_launch_tau_gap 5%)"
    assert reasons[2].startswith("code T=0.8: tau 4.000 vs in-process 2.000 (more than 3 standard errors")
    entry = serve_check.with_launch_command({"status": "passed", "reason": None},
                                            {"status": "passed", "reason": None, "disagreements": reasons[:1]})
    assert entry["status"] == "failed" and entry["reason"] == "launch.md's command: " + reasons[0]
    failed = serve_check.with_launch_command({"status": "passed", "reason": None},
                                             {"status": "failed", "reason": "launch.md's command: ValueError: x"})
    assert failed["status"] == "failed" and failed["launch_command"]["reason"].endswith("ValueError: x")


def test_vllm_cpus_top_k_crash_is_a_clear_reason():
    error = serve_check.explained("RuntimeError: max(): Expected reduction dim to be specified for input.numel() == 0. "
                                  "Specify the reduction dim with the 'dim' argument.")
    assert "top_k > 0 (evaluate.top_k)" in error and "use evaluate.top_k: 0" in error
    assert serve_check.explained("ValueError: other") == "ValueError: other"
    assert ServeCheckConfig().launch_command is True
