import json
import math

import pytest

from pipeline.config.promote_config import DomainGate, PromoteConfig
from pipeline.promote.gate import GateDecision, decide, describe, gate_metrics

CONFIG = PromoteConfig(
    require_lossless=True,
    max_regression=0.05,
    gates={"code": DomainGate(min_tau=1.2, min_speedup=1.0), "text": DomainGate(min_tau=1.1, min_speedup=0.0)},
)
GREEDY = ["0.0"]
GOOD = {"lossless": 1.0, "mismatches": 0.0, "T0.0/code/tau": 2.0, "T0.0/code/speedup": 1.4,
        "T0.0/text/tau": 1.8, "T0.0/text/speedup": 1.2}


def failing(decision: GateDecision) -> set[tuple[str, str]]:
    return {(c.check, c.metric) for c in decision.comparisons if not c.passed}


def test_all_thresholds_pass_without_champion():
    decision = decide(GOOD, CONFIG, GREEDY)
    assert decision.promote and decision.reasons == []
    # lossless + 2 floors x 2 domains, no regression checks without a champion
    assert [(c.check, c.metric) for c in decision.comparisons] == [
        ("lossless", "lossless"), ("floor", "T0.0/code/tau"), ("floor", "T0.0/code/speedup"),
        ("floor", "T0.0/text/tau"), ("floor", "T0.0/text/speedup"),
    ]
    assert decision.champion_version is None


@pytest.mark.parametrize("metric, value, check", [
    ("T0.0/code/tau", 1.19, "floor"),
    ("T0.0/code/speedup", 0.9, "floor"),
    ("T0.0/text/tau", math.nan, "floor"),
    ("lossless", 0.0, "lossless"),
    ("lossless", math.nan, "lossless"),
])
def test_one_bad_metric_blocks_promotion(metric, value, check):
    decision = decide({**GOOD, metric: value}, CONFIG, GREEDY)
    assert not decision.promote
    assert failing(decision) == {(check, metric)}
    assert len(decision.reasons) == 1 and describe(metric) in decision.reasons[0]


def test_missing_domain_never_promotes():
    candidate = {key: value for key, value in GOOD.items() if not key.startswith("T0.0/text/")}
    decision = decide(candidate, CONFIG, GREEDY)
    assert not decision.promote
    assert failing(decision) == {("floor", "T0.0/text/tau"), ("floor", "T0.0/text/speedup")}
    assert all("missing/NaN" in reason for reason in decision.reasons)


def test_domain_without_a_gate_gets_the_default_gate():
    config = PromoteConfig(default_gate=DomainGate(min_tau=2.5, min_speedup=0.0))
    stories = {"lossless": 1.0, "mismatches": 0.0, "T0.0/stories/tau": 2.0, "T0.0/stories/speedup": 0.9}
    decision = decide(stories, config, GREEDY)
    assert not decision.promote and failing(decision) == {("floor", "T0.0/stories/tau")}
    assert decide({**stories, "T0.0/stories/tau": 3.0}, config, GREEDY).promote


def test_no_evaluated_domain_never_promotes():
    decision = decide({"lossless": 1.0, "mismatches": 0.0}, PromoteConfig(), GREEDY)
    assert not decision.promote and decision.reasons == ["no domain was evaluated"]


def test_lossless_not_checked_when_not_required():
    config = CONFIG.model_copy(update={"require_lossless": False})
    decision = decide({**GOOD, "lossless": 0.0}, config, GREEDY)
    assert decision.promote
    assert "lossless" not in {c.check for c in decision.comparisons}


def test_regression_is_relative_per_domain_and_metric():
    champion = {**GOOD, "T0.0/code/tau": 2.0, "T0.0/text/speedup": 1.2}
    within = decide({**GOOD, "T0.0/code/tau": 1.91}, CONFIG, GREEDY, champion, "3")  # 2.0 * 0.95 = 1.9
    assert within.promote
    assert within.champion_version == "3"
    beyond = decide({**GOOD, "T0.0/code/tau": 1.89, "T0.0/text/speedup": 1.13}, CONFIG, GREEDY, champion, "3")
    assert not beyond.promote
    assert failing(beyond) == {("regression", "T0.0/code/tau"), ("regression", "T0.0/text/speedup")}
    by_metric = {c.metric: c for c in beyond.comparisons if c.check == "regression"}
    assert by_metric["T0.0/code/tau"].threshold == pytest.approx(1.9)
    assert "champion v3" in by_metric["T0.0/code/tau"].detail


def test_nan_candidate_fails_regression_and_nan_champion_does_not_block():
    nan_champion = {**GOOD, "T0.0/code/tau": math.nan}
    decision = decide(GOOD, CONFIG, GREEDY, nan_champion, "1")
    assert decision.promote
    code_tau = next(c for c in decision.comparisons if c.check == "regression" and c.metric == "T0.0/code/tau")
    assert code_tau.threshold is None and "no value" in code_tau.detail
    assert not decide({**GOOD, "T0.0/code/speedup": math.nan}, CONFIG, GREEDY, GOOD, "1").promote


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
    assert metrics["lossless"] == 1.0 and metrics["T0.0/code/tau"] == 2.5 and metrics["T0.0/text/speedup"] == 1.1
    assert metrics["T0.8/code/tau"] == 9.0  # every evaluated temperature is recorded; the gate picks its own
    assert math.isnan(metrics["T0.0/code/speedup"]) and math.isnan(metrics["T0.0/code/acceptance_rate"])
    assert math.isnan(gate_metrics({"lossless": "yes"})["lossless"])
    assert not decide(metrics, CONFIG, GREEDY).promote  # the junk speedup blocks it


def test_decision_round_trips_through_json_without_nan():
    decision = decide({**GOOD, "T0.0/code/tau": math.nan}, CONFIG, GREEDY, GOOD, "2")
    text = json.dumps(decision.to_dict(), allow_nan=False)  # strict JSON: NaN became null
    assert GateDecision.from_dict(json.loads(text)).to_dict() == decision.to_dict()


@pytest.mark.parametrize("change, reason", [
    ({"mismatches": 5.0}, "flag says verified but 5 mismatches"),
    ({"mismatches": math.nan}, "mismatch count missing/NaN"),
    ({"T0.0/code/tau": 1e308}, "T=0.0 code tau 1e+308 is outside the possible range"),
    ({"T0.0/text/acceptance_rate": 3.0}, "T=0.0 text acceptance_rate 3 is outside the possible range"),
    ({"T0.0/code/speedup": -1.0}, "T=0.0 code speedup"),
])
def test_self_contradicting_or_impossible_metrics_never_promote(change, reason):
    decision = decide({**GOOD, **change}, CONFIG, GREEDY)
    assert not decision.promote
    assert any(reason in text for text in decision.reasons), decision.reasons


def test_gate_metrics_reads_the_mismatch_count():
    metrics = gate_metrics({"lossless": True, "mismatches": 5, "by_temperature": {}})
    assert metrics["lossless"] == 1.0 and metrics["mismatches"] == 5.0
    assert not decide({**GOOD, **metrics}, CONFIG, GREEDY).promote


def _noisy(candidate: dict, domain: str, spread: float) -> dict:
    return {**candidate, f"T0.0/{domain}/speedup_noisy": 1.0, f"T0.0/{domain}/speedup_spread": spread}


def test_a_speed_check_inside_the_timing_noise_is_undecided_not_a_rejection():
    """evaluate called the timing too noisy (spread 26-248%) and the gate still rejected: no more."""
    decision = decide(_noisy({**GOOD, "T0.0/code/speedup": 0.9}, "code", 0.6), CONFIG, GREEDY)
    assert not decision.promote and decision.reasons == [] and decision.outcome == "undecided"
    assert len(decision.undecided) == 1 and "T=0.0 code speedup" in decision.undecided[0]
    assert "undecided" in decision.undecided[0] and "60%" in decision.undecided[0]
    # a noisy pass promotes nothing either: the noise reaches across the floor
    assert decide(_noisy(GOOD, "code", 0.6), CONFIG, GREEDY).outcome == "undecided"
    # round trip through the version tag keeps it undecided
    restored = GateDecision.from_dict(json.loads(json.dumps(decision.to_dict())))
    assert restored.outcome == "undecided" and restored.undecided == decision.undecided


def test_noise_that_cannot_reach_the_threshold_still_decides():
    assert decide(_noisy(GOOD, "code", 0.1), CONFIG, GREEDY).outcome == "promoted"  # 1.4 - 10% stays above 1.0
    rejected = decide(_noisy({**GOOD, "T0.0/code/speedup": 0.5}, "code", 0.3), CONFIG, GREEDY)  # 0.5 + 30% < 1.0
    assert rejected.outcome == "rejected" and not rejected.undecided
    assert decide(_noisy(GOOD, "text", 5.0), CONFIG, GREEDY).outcome == "promoted"  # text's speedup floor is 0
    # another failure decides: a lossy drafter is rejected whatever its timing
    assert decide(_noisy({**GOOD, "lossless": 0.0}, "code", 0.6), CONFIG, GREEDY).outcome == "rejected"


def test_gate_metrics_carry_the_noise_flag_only_when_set():
    entry = {"lossless": True, "mismatches": 0, "by_temperature": {"0.0": {
        "code": {"tau": 2.0, "speedup": 1.1, "speedup_spread": 0.4, "speedup_noisy": True},
        "text": {"tau": 2.0, "speedup": 1.1, "speedup_spread": 0.1, "speedup_noisy": False}}}}
    metrics = gate_metrics(entry)
    assert metrics["T0.0/code/speedup_noisy"] == 1.0 and metrics["T0.0/code/speedup_spread"] == 0.4
    assert "T0.0/text/speedup_noisy" not in metrics and "T0.0/text/speedup_spread" not in metrics


# ------------------------------------------------------------------ every serving temperature

SAMPLED = {"T0.8/code/tau": 1.83, "T0.8/code/speedup": 0.89, "T0.8/text/tau": 1.79, "T0.8/text/speedup": 1.1}


def test_a_drafter_that_pays_greedy_but_not_sampled_is_rejected_naming_the_temperature():
    """The demo's block drafter as measured: 1.4x at T=0, 0.89x on code at T=0.8, and promoted all the same by a
    greedy-only gate."""
    decision = decide({**GOOD, **SAMPLED}, CONFIG, ["0.0", "0.8"])
    assert decision.outcome == "rejected"
    assert decision.reasons == ["T=0.8 code speedup 0.89 < floor 1"]
    assert decision.verdicts() == {"0.0": {"code": "passed", "text": "passed"},
                                   "0.8": {"code": "rejected", "text": "passed"}}
    greedy_only = decide({**GOOD, **SAMPLED}, CONFIG, GREEDY)  # a greedy-only deployment
    assert greedy_only.promote and set(greedy_only.verdicts()) == {"0.0"}


def test_a_listed_temperature_without_metrics_never_promotes():
    decision = decide(GOOD, CONFIG, ["0.0", "0.8"])
    assert not decision.promote
    assert "T=0.8 code tau is missing/NaN (floor 1.2)" in decision.reasons
    assert decision.verdicts()["0.8"] == {"code": "rejected", "text": "rejected"}


def test_regression_is_checked_at_each_gated_temperature():
    champion = {**GOOD, **SAMPLED, "T0.8/code/speedup": 1.3}
    candidate = {**GOOD, **SAMPLED, "T0.8/code/speedup": 1.2}  # floor 1.0 holds, 1.2 < 1.3 - 5%
    decision = decide(candidate, CONFIG, ["0.0", "0.8"], champion, "4")
    assert decision.reasons == ["T=0.8 code speedup 1.2 < 1.235 (champion v4 1.3 - 5%)"]
    assert decide(candidate, CONFIG, GREEDY, champion, "4").promote


def test_only_the_gated_temperatures_are_range_checked():
    broken_sampled = {**GOOD, **SAMPLED, "T0.8/code/tau": 1e308}
    assert decide(broken_sampled, CONFIG, GREEDY).promote
    assert "T=0.8 code tau 1e+308 is outside" in decide(broken_sampled, CONFIG, ["0.0", "0.8"]).reasons[0]


def test_a_noisy_sampled_speed_is_undecided_in_its_own_cell():
    noisy = {**GOOD, **SAMPLED, "T0.8/code/speedup_noisy": 1.0, "T0.8/code/speedup_spread": 0.5}
    decision = decide(noisy, CONFIG, ["0.0", "0.8"])
    assert decision.outcome == "undecided" and decision.verdicts()["0.8"]["code"] == "undecided"
    assert decision.verdicts()["0.0"] == {"code": "passed", "text": "passed"}
