"""promote with two serving engines in metrics/serving.json (vLLM's `drafters`, llama.cpp's `llamacpp.drafters`):
every engine that served a drafter must pass it, an engine that cannot serve it on this build is left out, and
a drafter no engine served is refused."""

from __future__ import annotations

import pytest

from pipeline.config.schema import parse_all
from pipeline.promote.promote import serve_check_refusals


def _params():
    return parse_all({})


def _passed(tau: float = 3.0) -> dict:
    greedy = {"outputs_identical": True, "mismatched_prompts": 0, "vllm": {"tau": tau}}
    return {"status": "passed", "reason": None,
            "domains": {"code": {"single": {**greedy, "concurrency": 1}, "batched": {**greedy, "concurrency": 8},
                                 "draftline": {"tau": tau}, "sampled": {}}}}


SKIPPED = {"status": "skipped", "reason": "Model Runner V1 does not support: dspark", "domains": {}}


@pytest.mark.parametrize("vllm, llamacpp, refused", [
    (SKIPPED, _passed(), None),  # DSpark on vLLM's CPU build: llama.cpp alone served it
    (_passed(), {"status": "failed", "reason": "code: outputs differ", "domains": {}}, "llama.cpp: serve_check failed"),
    (_passed(), _passed(2.0), None),
    (_passed(), {"status": "passed", "reason": None, "domains": {"code": {**_passed()["domains"]["code"],
                                                                        "draftline": {"tau": 1.0}}}},
     "llama.cpp: serve_check says passed but code"),  # rederived from the numbers, not the status
    (SKIPPED, {**SKIPPED, "reason": "no .venv-llamacpp"}, "no .venv-llamacpp"),  # no engine served it
])
def test_every_engine_that_served_the_drafter_must_pass(vllm, llamacpp, refused):
    serving = {"drafters": {"block": vllm}, "llamacpp": {"drafters": {"block": llamacpp}}}
    reason = serve_check_refusals(_params(), serving, ["block"]).get("block")
    assert (reason is None) if refused is None else (refused in reason), reason


def test_a_report_without_llamacpp_is_judged_on_vllm_alone():
    assert serve_check_refusals(_params(), {"drafters": {"ar": _passed()}}, ["ar"]) == {}
    assert "dspark" in serve_check_refusals(_params(), {"drafters": {"block": SKIPPED}}, ["block"])["block"]
