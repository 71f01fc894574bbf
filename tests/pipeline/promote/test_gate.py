import json
import math

import pytest

from pipeline.config.promote_config import DomainGate, PromoteConfig
from pipeline.promote.gate import GateDecision, decide, gate_metrics

CONFIG = PromoteConfig(
    require_lossless=True,
    max_regression=0.05,
    gates={"code": DomainGate(min_tau=1.2, min_speedup=1.0), "text": DomainGate(min_tau=1.1, min_speedup=0.0)},
)
GOOD = {"lossless": 1.0, "mismatches": 0.0, "code.tau": 2.0, "code.speedup": 1.4, "text.tau": 1.8, "text.speedup": 1.2}


def failing(decision: GateDecision) -> set[tuple[str, str]]:
    return {(c.check, c.metric) for c in decision.comparisons if not c.passed}


def test_all_thresholds_pass_without_champion():
    decision = decide(GOOD, CONFIG)
    assert decision.promote and decision.reasons == []
    # lossless + 2 floors x 2 domains, no regression checks without a champion
    assert [(c.check, c.metric) for c in decision.comparisons] == [
        ("lossless", "lossless"), ("floor", "code.tau"), ("floor", "code.speedup"),
        ("floor", "text.tau"), ("floor", "text.speedup"),
    ]
    assert decision.champion_version is None


@pytest.mark.parametrize("metric, value, check", [
    ("code.tau", 1.19, "floor"),
    ("code.speedup", 0.9, "floor"),
    ("text.tau", math.nan, "floor"),
    ("lossless", 0.0, "lossless"),
    ("lossless", math.nan, "lossless"),
])
def test_one_bad_metric_blocks_promotion(metric, value, check):
    decision = decide({**GOOD, metric: value}, CONFIG)
    assert not decision.promote
    assert failing(decision) == {(check, metric)}
    assert len(decision.reasons) == 1 and metric in decision.reasons[0]


def test_missing_domain_never_promotes():
    candidate = {key: value for key, value in GOOD.items() if not key.startswith("text.")}
    decision = decide(candidate, CONFIG)
    assert not decision.promote
    assert failing(decision) == {("floor", "text.tau"), ("floor", "text.speedup")}
    assert all("missing/NaN" in reason for reason in decision.reasons)


def test_domain_without_a_gate_gets_the_default_gate():
    config = PromoteConfig(default_gate=DomainGate(min_tau=2.5, min_speedup=0.0))
    decision = decide({"lossless": 1.0, "mismatches": 0.0, "stories.tau": 2.0, "stories.speedup": 0.9}, config)
    assert not decision.promote and failing(decision) == {("floor", "stories.tau")}
    assert decide({"lossless": 1.0, "mismatches": 0.0, "stories.tau": 3.0, "stories.speedup": 0.9}, config).promote


def test_no_evaluated_domain_never_promotes():
    decision = decide({"lossless": 1.0, "mismatches": 0.0}, PromoteConfig())
    assert not decision.promote and decision.reasons == ["no domain was evaluated"]


def test_lossless_not_checked_when_not_required():
    config = CONFIG.model_copy(update={"require_lossless": False})
    decision = decide({**GOOD, "lossless": 0.0}, config)
    assert decision.promote
    assert "lossless" not in {c.check for c in decision.comparisons}


def test_regression_is_relative_per_domain_and_metric():
    champion = {**GOOD, "code.tau": 2.0, "text.speedup": 1.2}
    within = decide({**GOOD, "code.tau": 1.91}, CONFIG, champion, "3")  # 2.0 * 0.95 = 1.9
    assert within.promote
    assert within.champion_version == "3"
    beyond = decide({**GOOD, "code.tau": 1.89, "text.speedup": 1.13}, CONFIG, champion, "3")
    assert not beyond.promote
    assert failing(beyond) == {("regression", "code.tau"), ("regression", "text.speedup")}
    by_metric = {c.metric: c for c in beyond.comparisons if c.check == "regression"}
    assert by_metric["code.tau"].threshold == pytest.approx(1.9)
    assert "champion v3" in by_metric["code.tau"].detail


def test_nan_candidate_fails_regression_and_nan_champion_does_not_block():
    nan_champion = {**GOOD, "code.tau": math.nan}
    decision = decide(GOOD, CONFIG, nan_champion, "1")
    assert decision.promote
    code_tau = next(c for c in decision.comparisons if c.check == "regression" and c.metric == "code.tau")
    assert code_tau.threshold is None and "no value" in code_tau.detail
    assert not decide({**GOOD, "code.speedup": math.nan}, CONFIG, GOOD, "1").promote


def test_gate_metrics_reads_greedy_metrics_and_marks_junk_as_nan():
    entry = {
        "lossless": True,
        "mismatches": 0,
        "by_temperature": {
            "0.0": {"code": {"tau": 2.5, "speedup": "fast", "acceptance_rate": None},
                    "text": {"tau": 1.5, "speedup": 1.1}},
            "0.8": {"code": {"tau": 9.0, "speedup": 9.0}},
        },
    }
    metrics = gate_metrics(entry)
    assert metrics["lossless"] == 1.0 and metrics["code.tau"] == 2.5 and metrics["text.speedup"] == 1.1
    assert math.isnan(metrics["code.speedup"]) and math.isnan(metrics["code.acceptance_rate"])
    assert math.isnan(gate_metrics({"lossless": "yes"})["lossless"])
    assert not decide(metrics, CONFIG).promote  # the junk speedup blocks it


def test_decision_round_trips_through_json_without_nan():
    decision = decide({**GOOD, "code.tau": math.nan}, CONFIG, GOOD, "2")
    text = json.dumps(decision.to_dict(), allow_nan=False)  # strict JSON: NaN became null
    assert GateDecision.from_dict(json.loads(text)).to_dict() == decision.to_dict()


@pytest.mark.parametrize("change, reason", [
    ({"mismatches": 5.0}, "flag says verified but 5 mismatches"),
    ({"mismatches": math.nan}, "mismatch count missing/NaN"),
    ({"code.tau": 1e308}, "code.tau 1e+308 is outside the possible range"),
    ({"text.acceptance_rate": 3.0}, "text.acceptance_rate 3 is outside the possible range"),
    ({"code.speedup": -1.0}, "code.speedup"),
])
def test_self_contradicting_or_impossible_metrics_never_promote(change, reason):
    decision = decide({**GOOD, **change}, CONFIG)
    assert not decision.promote
    assert any(reason in text for text in decision.reasons), decision.reasons


def test_gate_metrics_reads_the_mismatch_count():
    metrics = gate_metrics({"lossless": True, "mismatches": 5, "by_temperature": {}})
    assert metrics["lossless"] == 1.0 and metrics["mismatches"] == 5.0
    assert not decide({**GOOD, **metrics}, CONFIG).promote


def _noisy(candidate: dict, domain: str, spread: float) -> dict:
    return {**candidate, f"{domain}.speedup_noisy": 1.0, f"{domain}.speedup_spread": spread}


def test_a_speed_check_inside_the_timing_noise_is_undecided_not_a_rejection():
    """evaluate called the timing too noisy (spread 26-248%) and the gate still rejected: no more."""
    decision = decide(_noisy({**GOOD, "code.speedup": 0.9}, "code", 0.6), CONFIG)
    assert not decision.promote and decision.reasons == [] and decision.outcome == "undecided"
    assert len(decision.undecided) == 1 and "code.speedup" in decision.undecided[0]
    assert "undecided" in decision.undecided[0] and "60%" in decision.undecided[0]
    # a noisy pass promotes nothing either: the noise reaches across the floor
    assert decide(_noisy(GOOD, "code", 0.6), CONFIG).outcome == "undecided"
    # round trip through the version tag keeps it undecided
    restored = GateDecision.from_dict(json.loads(json.dumps(decision.to_dict())))
    assert restored.outcome == "undecided" and restored.undecided == decision.undecided


def test_noise_that_cannot_reach_the_threshold_still_decides():
    assert decide(_noisy(GOOD, "code", 0.1), CONFIG).outcome == "promoted"  # 1.4 - 10% stays above 1.0
    rejected = decide(_noisy({**GOOD, "code.speedup": 0.5}, "code", 0.3), CONFIG)  # 0.5 + 30% < 1.0
    assert rejected.outcome == "rejected" and not rejected.undecided
    assert decide(_noisy(GOOD, "text", 5.0), CONFIG).outcome == "promoted"  # text's speedup floor is 0
    # another failure decides: a lossy drafter is rejected whatever its timing
    assert decide(_noisy({**GOOD, "lossless": 0.0}, "code", 0.6), CONFIG).outcome == "rejected"


def test_gate_metrics_carry_the_noise_flag_only_when_set():
    entry = {"lossless": True, "mismatches": 0, "by_temperature": {"0.0": {
        "code": {"tau": 2.0, "speedup": 1.1, "speedup_spread": 0.4, "speedup_noisy": True},
        "text": {"tau": 2.0, "speedup": 1.1, "speedup_spread": 0.1, "speedup_noisy": False}}}}
    metrics = gate_metrics(entry)
    assert metrics["code.speedup_noisy"] == 1.0 and metrics["code.speedup_spread"] == 0.4
    assert "text.speedup_noisy" not in metrics and "text.speedup_spread" not in metrics
