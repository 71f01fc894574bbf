"""Drafter losses as plain functions over (B, T, V) logits and a (B, T) response mask.

`ce` is sequence-level KD on the verifier's response tokens; `fkl`/`rkl`/`tvd`/`jsd` are token-level
distillation against the frozen verifier's logits (DistillSpec: TVD bounds acceptance; forward KL is
what EAGLE-3/SpecForge use). Each returns the mean over masked-in positions; positions with mask 0
(prompt, padding) contribute nothing, whatever their logits hold. Temperature softens both
distributions; no T² factor, so the values stay comparable across temperatures.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.config.trainer_config import LossConfig
from pipeline.drafters.block.config import BlockLossConfig

LOSS_NAMES = ("ce", "fkl", "rkl", "tvd", "jsd")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` (B, T) where `mask` is true; 0 when nothing is masked in."""
    mask = mask.bool()
    picked = torch.where(mask, values, torch.zeros_like(values))
    return picked.sum() / mask.sum().clamp(min=1)


def ce(student_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of `labels` (B, T) under the student."""
    safe_labels = torch.where(mask.bool(), labels, torch.zeros_like(labels))
    nll = F.cross_entropy(student_logits.float().flatten(0, 1), safe_labels.flatten(), reduction="none")
    return masked_mean(nll.view_as(labels), mask)


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return F.log_softmax(logits.float() / temperature, dim=-1)


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per position, with 0·log 0 = 0."""
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)


def fkl(student_logits, teacher_logits, mask, temperature: float = 1.0) -> torch.Tensor:
    """Forward KL(teacher || student): mode-covering."""
    return masked_mean(_kl(_log_probs(teacher_logits, temperature), _log_probs(student_logits, temperature)), mask)


def rkl(student_logits, teacher_logits, mask, temperature: float = 1.0) -> torch.Tensor:
    """Reverse KL(student || teacher): mode-seeking."""
    return masked_mean(_kl(_log_probs(student_logits, temperature), _log_probs(teacher_logits, temperature)), mask)


def _tv(student_logits, teacher_logits, temperature: float) -> torch.Tensor:
    """Total variation distance ½ Σ |p − q| per position."""
    p = _log_probs(teacher_logits, temperature).exp()
    q = _log_probs(student_logits, temperature).exp()
    return 0.5 * (p - q).abs().sum(-1)


def tvd(student_logits, teacher_logits, mask, temperature: float = 1.0) -> torch.Tensor:
    """Total variation distance ½ Σ |p − q|."""
    return masked_mean(_tv(student_logits, teacher_logits, temperature), mask)


def jsd(student_logits, teacher_logits, mask, temperature: float = 1.0) -> torch.Tensor:
    """Jensen–Shannon divergence ½ KL(p || m) + ½ KL(q || m), m = ½ (p + q)."""
    log_p = _log_probs(teacher_logits, temperature)
    log_q = _log_probs(student_logits, temperature)
    log_m = torch.logaddexp(log_p, log_q) - torch.log(torch.tensor(2.0, device=log_p.device))
    return masked_mean(0.5 * _kl(log_p, log_m) + 0.5 * _kl(log_q, log_m), mask)


def mixture(
    cfg: LossConfig,
    student_logits: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor | None = None,
    teacher_logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Σ_name weight_name · loss_name over the terms with weight > 0; returns (total, {name: term})."""
    terms: dict[str, torch.Tensor] = {}
    for name in LOSS_NAMES:
        weight = getattr(cfg, name)
        if weight <= 0:
            continue
        if name == "ce":
            if labels is None:
                raise ValueError("the 'ce' loss needs labels")
            terms[name] = ce(student_logits, labels, mask)
        else:
            if teacher_logits is None:
                raise ValueError(f"the '{name}' loss needs the verifier's logits")
            terms[name] = DIVERGENCES[name](student_logits, teacher_logits, mask, cfg.temperature)
    total = sum(getattr(cfg, name) * value for name, value in terms.items())
    return total, terms


DIVERGENCES = {"fkl": fkl, "rkl": rkl, "tvd": tvd, "jsd": jsd}


def needs_teacher(cfg: LossConfig) -> bool:
    return any(getattr(cfg, name) > 0 for name in DIVERGENCES)


# --------------------------------------------------------------------------- block drafter


def position_weighted_mean(values: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ w_k·values over valid (…, k) / Σ w_k over the same; `values`/`valid` (…, L−1), `weights` (L−1,)."""
    weight = weights.to(values.device) * valid
    return (values * weight).sum() / weight.sum().clamp(min=1e-12)


def block_loss(
    cfg: BlockLossConfig,
    student_logits: torch.Tensor,
    valid: torch.Tensor,
    weights: torch.Tensor,
    labels: torch.Tensor | None = None,
    teacher_logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The block drafter's loss over logits (…, L−1, V): Σ weight · position-weighted term; returns (total, terms).

    `labels` (…, L−1) feed `ce` (the verifier's argmax or corpus tokens, the caller's choice);
    `teacher_logits` (…, L−1, V) feed `fkl`.
    """
    terms: dict[str, torch.Tensor] = {}
    if cfg.ce > 0:
        if labels is None:
            raise ValueError("the 'ce' block loss needs labels")
        safe = torch.where(valid, labels, torch.zeros_like(labels))
        nll = F.cross_entropy(student_logits.float().flatten(0, -2), safe.flatten(), reduction="none")
        terms["ce"] = position_weighted_mean(nll.view_as(labels), valid, weights)
    if cfg.fkl > 0:
        if teacher_logits is None:
            raise ValueError("the 'fkl' block loss needs the verifier's logits")
        kl = _kl(_log_probs(teacher_logits, cfg.temperature), _log_probs(student_logits, cfg.temperature))
        terms["fkl"] = position_weighted_mean(kl, valid, weights)
    total = sum(getattr(cfg, name) * value for name, value in terms.items())
    return total, terms


def acceptance_rate(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Σ_v min(p_v, q_v) = 1 − TV(p, q) per position: the probability that rejection sampling accepts a draft
    from q against p, the confidence head's target (as the DSpark reference trains it)."""
    return 1.0 - _tv(student_logits, teacher_logits, temperature)


def confidence_loss(confidence_logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor,
                    weights: torch.Tensor) -> torch.Tensor:
    """Position-weighted BCE of the confidence head's logits (…, L−1) against acceptance rates in [0, 1]."""
    bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), target.float().clamp(0.0, 1.0),
                                             reduction="none")
    return position_weighted_mean(bce, valid, weights)


def default_gamma(block_size: int) -> float:
    """Decay of the position weights: 4 at B=8, 5 at B=10, 7 at B=16 (DFlash), piecewise linear beyond."""
    if block_size <= 10:
        return max(1.0, 4.0 + 0.5 * (block_size - 8))
    return 5.0 + (block_size - 10) / 3.0


def position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """w_k = exp(−(k−1)/γ) for block positions k = 1..B−1, normalised to sum 1."""
    gamma = default_gamma(block_size) if gamma is None else gamma
    k = torch.arange(1, block_size, dtype=torch.float32)
    weights = torch.exp(-(k - 1) / gamma)
    return weights / weights.sum()
