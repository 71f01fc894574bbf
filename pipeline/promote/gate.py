"""The promotion gate (docs/algorithms.md#promotion-gate): pure functions from metrics and thresholds to a decision.

Metrics travel as a flat mapping `name -> float` (`lossless`, `T<temperature>/<domain>/tau`, ...; the names
of the evaluation run's MLflow metrics) because that is what survives a round trip through MLflow tags, so a
candidate read from `metrics/eval.json` and a champion read back from the registry compare the same way.
Every evaluated temperature is recorded; the floors apply to each domain at each temperature the gate is
given (`promote.temperatures`), and a verdict is kept per temperature and domain.
A missing or NaN metric fails every comparison it takes part in: it can never promote, and neither
can a value no real evaluation produces (tau 1e308, an acceptance rate of 3): those mean a broken or
edited eval.json, never a great drafter.
A speed check on timings evaluate found too noisy (`<domain>.speedup_noisy`: spread past
`evaluate.max_speedup_spread`) is undecided when the spread could carry it across its threshold: neither
passed nor failed, and a decision with one (and no failure) is `undecided`, which never moves an alias.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

from pipeline.config.promote_config import PromoteConfig

GATED_METRICS = ("tau", "speedup")
# Recorded next to the gated ones so a version's tags describe it fully; never gated.
REPORTED_METRICS = ("tau", "speedup", "acceptance_rate", "tokens_per_s", "baseline_tokens_per_s")
# The most a verifier forward can commit: 63 drafts of the largest block (64) plus the bonus token.
# A drafter's own bound (its drafts per step plus the bonus token) travels as the metric `max_tau`.
MAX_TAU = 64.0
# Plausible ranges (inclusive); speedup cannot beat tokens committed per verifier forward by much.
PLAUSIBLE_RANGES = {
    "tau": (1.0, MAX_TAU),
    "speedup": (0.0, MAX_TAU),
    "acceptance_rate": (0.0, 1.0),
    "tokens_per_s": (0.0, math.inf),
    "baseline_tokens_per_s": (0.0, math.inf),
}


def metric_key(temperature: str, domain: str, name: str) -> str:
    return f"T{temperature}/{domain}/{name}"


def metric_cell(metric: str) -> tuple[str, str] | None:
    """(temperature, domain) of a per-cell metric, None for a drafter-wide one (`lossless`, `max_tau`)."""
    parts = metric.split("/")
    return (parts[0][1:], parts[1]) if len(parts) == 3 and parts[0].startswith("T") else None


def metric_name(metric: str) -> str:
    return metric.rpartition("/")[2]


def describe(metric: str) -> str:
    """`T0.8/code/speedup` as a reader says it: `T=0.8 code speedup`."""
    cell = metric_cell(metric)
    return metric if cell is None else f"T={cell[0]} {cell[1]} {metric_name(metric)}"


@dataclass(frozen=True)
class Comparison:
    check: str  # "lossless" | "floor" | "regression"
    metric: str
    value: float | None
    threshold: float | None
    passed: bool
    detail: str
    undecided: bool = False  # a speed check inside the timing noise: not passed, not a failure

    def to_dict(self) -> dict:
        out = asdict(self)
        out["value"] = _finite_or_none(self.value)
        out["threshold"] = _finite_or_none(self.threshold)
        return out


VERDICT_ORDER = ("passed", "undecided", "rejected")  # a cell takes the worst of its comparisons


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    comparisons: list[Comparison] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    champion_version: str | None = None
    undecided: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return "promoted" if self.promote else "rejected" if self.reasons else "undecided"

    def verdicts(self) -> dict[str, dict[str, str]]:
        """temperature -> domain -> passed | undecided | rejected, from the comparisons of that cell (a
        drafter-wide check, losslessness, decides the whole drafter and no cell)."""
        out: dict[str, dict[str, str]] = {}
        for comparison in self.comparisons:
            cell = metric_cell(comparison.metric)
            if cell is None:
                continue
            verdict = "passed" if comparison.passed else "undecided" if comparison.undecided else "rejected"
            by_domain = out.setdefault(cell[0], {})
            by_domain[cell[1]] = max(by_domain.get(cell[1], "passed"), verdict, key=VERDICT_ORDER.index)
        return out

    def to_dict(self) -> dict:
        return {
            "promote": self.promote,
            "reasons": list(self.reasons),
            "undecided": list(self.undecided),
            "champion_version": self.champion_version,
            "comparisons": [comparison.to_dict() for comparison in self.comparisons],
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "GateDecision":
        comparisons = [
            Comparison(**{**item, "value": _nan_if_none(item["value"]), "threshold": _nan_if_none(item["threshold"])})
            for item in data["comparisons"]
        ]
        return cls(bool(data["promote"]), comparisons, list(data["reasons"]), data.get("champion_version"),
                   list(data.get("undecided", [])))


def _finite_or_none(value: float | None) -> float | None:
    return value if is_finite(value) else None


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)


def is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _as_float(value: object) -> float:
    """A JSON number, or NaN for anything else (missing, null, a string, a bool)."""
    return float(value) if is_finite(value) else math.nan


def gate_metrics(drafter_eval: Mapping) -> dict[str, float]:
    """Flatten one drafter's `metrics/eval.json` entry, every temperature, into the metrics the gate and the tags use."""
    lossless = drafter_eval.get("lossless")
    metrics = {"lossless": float(lossless) if isinstance(lossless, bool) else math.nan}
    metrics["mismatches"] = _as_float(drafter_eval.get("mismatches"))
    by_temperature = drafter_eval.get("by_temperature")
    for temperature, by_domain in sorted(by_temperature.items() if isinstance(by_temperature, Mapping) else ()):
        for domain, values in sorted(by_domain.items() if isinstance(by_domain, Mapping) else ()):  # else: missing
            if not isinstance(values, Mapping):
                continue
            for name in REPORTED_METRICS:
                metrics[metric_key(temperature, domain, name)] = _as_float(values.get(name))
            if values.get("speedup_noisy") is True:  # absent (an older evaluation): decided as before
                metrics[metric_key(temperature, domain, "speedup_noisy")] = 1.0
                metrics[metric_key(temperature, domain, "speedup_spread")] = _as_float(values.get("speedup_spread"))
    return metrics


def _within_noise(comparison: Comparison, candidate: Mapping[str, float]) -> Comparison:
    """`comparison` made undecided when it checks a speedup evaluate called too noisy and the spread
    of its repeats reaches across the threshold (a floor of 0 is decided whatever the noise)."""
    cell = metric_cell(comparison.metric)
    value, threshold = comparison.value, comparison.threshold
    if cell is None or metric_name(comparison.metric) != "speedup" \
            or candidate.get(metric_key(*cell, "speedup_noisy")) != 1.0 or not is_finite(value) \
            or not is_finite(threshold):
        return comparison
    spread = candidate.get(metric_key(*cell, "speedup_spread"), math.nan)
    if threshold <= 0 or (is_finite(spread) and abs(value - threshold) > spread * value):
        return comparison  # no speedup is below 0: that floor holds whatever the noise
    return Comparison(comparison.check, comparison.metric, value, threshold, False,
                      f"{comparison.detail}: undecided, the speedup varied by {spread:.0%} over evaluate's "
                      "repeats (past evaluate.max_speedup_spread)", undecided=True)


def _lossless_check(candidate: Mapping[str, float]) -> Comparison:
    """Decided by the mismatch count, not the flag alone: `lossless: true` with mismatches 5 (or
    missing) is an eval.json that contradicts itself, and that never promotes."""
    flag, mismatches = candidate.get("lossless", math.nan), candidate.get("mismatches", math.nan)
    counted_zero = is_finite(mismatches) and mismatches == 0
    passed = is_finite(flag) and flag == 1.0 and counted_zero
    if passed:
        detail = "lossless: verified (0 mismatches)"
    elif not is_finite(flag):
        detail = "lossless: missing/NaN (the evaluation did not report losslessness)"
    elif not is_finite(mismatches):
        detail = "lossless: mismatch count missing/NaN (the evaluation did not count mismatches)"
    elif flag == 1.0:
        detail = f"lossless: flag says verified but {mismatches:g} mismatches were counted"
    else:
        detail = f"lossless: failed (output differs from the verifier; mismatches {mismatches:g})"
    return Comparison("lossless", "lossless", flag, 1.0, passed, detail)


def _range_failures(candidate: Mapping[str, float], temperatures: Sequence[str]) -> list[Comparison]:
    """Only the failures, and only of what the gate reads (drafter-wide metrics and the gated temperatures):
    a plausible value adds nothing to the report."""
    failures = []
    own_max = candidate.get("max_tau", math.nan)
    for metric, value in sorted(candidate.items()):
        cell = metric_cell(metric)
        if cell is not None and cell[0] not in temperatures:
            continue
        name = metric_name(metric)
        low, high = PLAUSIBLE_RANGES.get(name, (-math.inf, math.inf))
        if name == "tau" and is_finite(own_max):
            high = min(high, own_max)
        if is_finite(value) and not low <= value <= high:
            failures.append(Comparison("range", metric, value, high if value > high else low, False,
                                       f"{describe(metric)} {value:.4g} is outside the possible range "
                                       f"[{low:g}, {high:g}]"))
    return failures


def _floor_check(metric: str, value: float, floor: float) -> Comparison:
    passed = is_finite(value) and value >= floor
    if not is_finite(value):
        detail = f"{describe(metric)} is missing/NaN (floor {floor:.4g})"
    else:
        detail = f"{describe(metric)} {value:.4g} {'>=' if passed else '<'} floor {floor:.4g}"
    return Comparison("floor", metric, value, floor, passed, detail)


def _regression_check(metric: str, value: float, champion_value: float, tolerance: float, version: str) -> Comparison:
    if not is_finite(champion_value):
        # Nothing to regress against: the champion never had this metric, so only the floor applies.
        return Comparison("regression", metric, value, None, True,
                          f"{describe(metric)}: champion v{version} has no value")
    threshold = champion_value * (1.0 - tolerance)
    passed = is_finite(value) and value >= threshold
    against = f"champion v{version} {champion_value:.4g} - {tolerance:.0%}"
    if not is_finite(value):
        detail = f"{describe(metric)} is missing/NaN (needs >= {threshold:.4g}: {against})"
    else:
        detail = f"{describe(metric)} {value:.4g} {'>=' if passed else '<'} {threshold:.4g} ({against})"
    return Comparison("regression", metric, value, threshold, passed, detail)


def gated_domains(candidate: Mapping[str, float], config: PromoteConfig) -> list[str]:
    """Every domain evaluated at any temperature (those without a gate of their own get the default gate) and
    every gated one (a gated domain the evaluation lacks fails on its missing metrics)."""
    evaluated = {cell[1] for metric in candidate
                 if (cell := metric_cell(metric)) is not None and metric_name(metric) == "tau"}
    return sorted(evaluated | set(config.gates))


def decide(
    candidate: Mapping[str, float],
    config: PromoteConfig,
    temperatures: Sequence[str],
    champion: Mapping[str, float] | None = None,
    champion_version: str | None = None,
) -> GateDecision:
    """Every threshold must hold: losslessness (when required), the floors of each domain at each of
    `temperatures` (eval.json's keys: "0.0", "0.8"), and no regression beyond `max_regression` (relative)
    against the current champion's metrics there, when there is one."""
    comparisons: list[Comparison] = []
    if config.require_lossless:
        comparisons.append(_lossless_check(candidate))
    comparisons += _range_failures(candidate, temperatures)
    domains = gated_domains(candidate, config)
    if not domains:
        comparisons.append(Comparison("floor", "domains", None, None, False, "no domain was evaluated"))
    cells = [(temperature, domain) for temperature in temperatures for domain in domains]
    for temperature, domain in cells:
        floors = config.gate(domain)
        for name, floor in (("tau", floors.min_tau), ("speedup", floors.min_speedup)):
            metric = metric_key(temperature, domain, name)
            comparisons.append(_floor_check(metric, candidate.get(metric, math.nan), floor))
    if champion is not None:
        for temperature, domain in cells:
            for name in GATED_METRICS:
                metric = metric_key(temperature, domain, name)
                comparisons.append(_regression_check(
                    metric, candidate.get(metric, math.nan), champion.get(metric, math.nan),
                    config.max_regression, champion_version or "?",
                ))
    comparisons = [_within_noise(comparison, candidate) for comparison in comparisons]
    reasons = [comparison.detail for comparison in comparisons if not comparison.passed and not comparison.undecided]
    undecided = [comparison.detail for comparison in comparisons if comparison.undecided]
    return GateDecision(not reasons and not undecided, comparisons, reasons,
                        champion_version if champion is not None else None, undecided)
