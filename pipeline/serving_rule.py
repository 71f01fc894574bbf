"""serve_check's pass rule over one drafter x domain record of `metrics/serving.json`.

One rule, read from the recorded numbers only (no torch, no vLLM): `serve_check` applies it when it
writes the record and `promote` applies it again when it reads the record, so a `status` edited by
hand cannot promote a drafter whose numbers fail.
"""

from __future__ import annotations

import math

SINGLE, BATCHED = "single", "batched"  # the greedy runs: one request at a time, and concurrent requests


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def relative_gap(value: float, reference: float) -> float:
    return abs(value - reference) / reference


def sampled_tolerance(vllm: dict, ours: dict, z: float) -> float | None:
    """Largest |τ_vLLM − τ_draftline| that sampling noise explains: z standard errors of the difference,
    each side's from the spread of accepted drafts per step over its drafting steps. Steps of one
    sequence are correlated, so this understates the noise a little; z = 3 leaves room for that.
    None when a side has fewer than two steps."""
    if not (_finite(vllm.get("tau_se")) and _finite(ours.get("tau_se"))):
        return None
    return z * math.sqrt(vllm["tau_se"] ** 2 + ours["tau_se"] ** 2)


def greedy_failure(record: object, name: str) -> str | None:
    record = record if isinstance(record, dict) else {}
    concurrency = record.get("concurrency")
    if record.get("outputs_identical") is not True or record.get("mismatched_prompts") != 0:
        return (f"outputs differ from the engine without speculation on {record.get('mismatched_prompts')}/"
                f"{record.get('prompts')} prompts ({name}, concurrency {concurrency})")
    if not _finite((record.get("vllm") or {}).get("tau")):
        return f"the engine proposed no drafts at concurrency {concurrency} (speculation was not active)"
    return None


def sampled_gaps(record: dict, sampled_z: float) -> list[str]:
    """Sampled runs whose vLLM τ is further from draftline's than sampling noise explains."""
    reasons = []
    for name, entry in sorted((record.get("sampled") or {}).items()):
        vllm, theirs = entry.get("vllm") or {}, entry.get("draftline") or {}
        if not _finite(vllm.get("tau")) or not _finite(theirs.get("tau")):
            reasons.append(f"{name}: the engine proposed no drafts")
            continue
        tolerance = sampled_tolerance(vllm, theirs, sampled_z)
        difference = abs(vllm["tau"] - theirs["tau"])
        if tolerance is not None and difference > tolerance:
            reasons.append(f"{name}: served tau {vllm['tau']:.3f} vs draftline tau {theirs['tau']:.3f}: difference "
                           f"{difference:.3f} > {sampled_z:g} standard errors ({tolerance:.3f})")
    return reasons


def domain_failures(record: dict, max_tau_gap: float, max_batch_tau_gap: float, sampled_z: float,
                    gate_sampled: bool = True) -> list[str]:
    """Why one drafter x domain record fails: greedy outputs not identical in both greedy runs, batched τ
    too far from single-request τ, either τ too far from draftline's, or (`gate_sampled`) a sampled τ
    further from draftline's than sampling noise explains."""
    reasons = [reason for name in (SINGLE, BATCHED) if (reason := greedy_failure(record.get(name), name))]
    if reasons:
        return reasons
    single, batched = record[SINGLE]["vllm"]["tau"], record[BATCHED]["vllm"]["tau"]
    batch_gap = relative_gap(batched, single)
    if batch_gap > max_batch_tau_gap:
        reasons.append(f"batched tau {batched:.3f} (concurrency {record[BATCHED].get('concurrency')}) vs "
                       f"single-request tau {single:.3f}: gap {batch_gap:.1%} > serve_check.max_batch_tau_gap "
                       f"{max_batch_tau_gap:.0%}")
    ours = (record.get("draftline") or {}).get("tau")
    if not (_finite(ours) and ours > 0):
        return reasons + ["no draftline tau recorded"]
    for name, tau in ((SINGLE, single), (BATCHED, batched)):
        if relative_gap(tau, ours) > max_tau_gap:
            reasons.append(f"served {name} tau {tau:.3f} vs draftline tau {ours:.3f}: gap {relative_gap(tau, ours):.1%} "
                           f"> serve_check.max_tau_gap {max_tau_gap:.0%}")
    return reasons + (sampled_gaps(record, sampled_z) if gate_sampled else [])


# Rejection sampling over the full draft distribution accepts every token a model drafts for itself; an engine that
# rejects more than this share of its verifier's own drafts at some temperature samples drafts its own way, so its
# sampled τ is not the τ of draftline's algorithm (llama.cpp 11549 drafts from the drafter's top 10: 0.48 accepted
# at T=0.8 on the demo verifier, serve_eval/repro/llamacpp_sampled_acceptance.py)
SELF_DRAFT_MIN_ACCEPTANCE = 0.9


def sampled_verification_defect(self_test: object) -> str | None:
    """Why an engine's sampled τ is not comparable with draftline's: its verifier drafting for itself at some sampled
    temperature had under SELF_DRAFT_MIN_ACCEPTANCE of its drafts accepted (recomputed from the recorded counts).
    None when the self-test passed, did not run, or recorded nothing readable: then sampled τ is gated."""
    if not isinstance(self_test, dict):
        return None
    for name, counts in sorted(self_test.items()):
        drafted = counts.get("drafted") if isinstance(counts, dict) else None
        accepted = counts.get("accepted") if isinstance(counts, dict) else None
        if _finite(drafted) and _finite(accepted) and drafted > 0 and 0 <= accepted <= drafted \
                and accepted / drafted < SELF_DRAFT_MIN_ACCEPTANCE:
            return (f"its verifier drafting for itself had {accepted:g} of {drafted:g} drafts accepted at {name} "
                    f"(rejection sampling accepts all; < {SELF_DRAFT_MIN_ACCEPTANCE:g})")
    return None
