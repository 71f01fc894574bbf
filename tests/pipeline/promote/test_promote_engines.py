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


def _sampled_gap() -> dict:
    """Passed by its status, but its T=0.8 τ is 1.38 against draftline's 2.20, far past 3 standard errors."""
    entry = _passed()
    entry["domains"]["code"]["sampled"] = {"T=0.8": {"vllm": {"tau": 1.38, "tau_se": 0.05},
                                                     "draftline": {"tau": 2.20, "tau_se": 0.05}}}
    return entry


@pytest.mark.parametrize("self_test, refused", [
    (None, True),  # no self-test recorded: sampled τ is gated
    ({"T=0.8": {"drafted": 504, "accepted": 243}}, False),  # the engine rejects its verifier's own drafts: its own sampling
    ({"T=0.8": {"drafted": 504, "accepted": 500}}, True),  # a sound engine: the gap is the drafter's
    ({"T=0.8": {"drafted": 504, "accepted": 900}}, True),  # counts that cannot be: no excuse read from them
    ({"error": "llama-server aborted"}, True),
])
def test_llamacpps_sampled_tau_is_gated_unless_its_recorded_self_test_shows_its_own_draft_sampling(self_test, refused):
    serving = {"drafters": {"ar": _passed()}, "llamacpp": {"drafters": {"ar": _sampled_gap()}}}
    if self_test is not None:
        serving["llamacpp"]["sampled_self_test"] = self_test
    reason = serve_check_refusals(_params(), serving, ["ar"]).get("ar")
    assert (reason is not None and "llama.cpp: serve_check says passed but code: T=0.8" in reason) if refused \
        else reason is None, reason


def test_llamacpps_self_test_never_excuses_vllm():
    serving = {"drafters": {"ar": _sampled_gap()},
               "llamacpp": {"drafters": {"ar": _passed()}, "sampled_self_test": {"T=0.8": {"drafted": 10, "accepted": 1}}}}
    assert "T=0.8" in serve_check_refusals(_params(), serving, ["ar"])["ar"]
