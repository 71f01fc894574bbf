"""The block drafter's losses: position-weighted terms over the block positions after the anchor, and the
confidence head's target and loss (pipeline/training/distillation.py holds the per-position divergences)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.drafters.block.config import BlockLossConfig
from pipeline.training.distillation import forward_kl_per_position, total_variation


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

    `labels` (…, L−1) feed `ce` (the verifier's argmax or corpus tokens, the caller's choice) and the D-PACE
    confidences; `teacher_logits` (…, L−1, V) feed `fkl`. `weights` (L−1,) are the fixed position weights;
    with `position_weights: dpace` every term is weighted per block by `dpace_weights` instead.
    """
    terms: dict[str, torch.Tensor] = {}
    if cfg.ce > 0 or cfg.position_weights == "dpace":
        if labels is None:
            raise ValueError("the 'ce' block loss and D-PACE weights need labels")
        safe = torch.where(valid, labels, torch.zeros_like(labels))
        nll = F.cross_entropy(student_logits.float().flatten(0, -2), safe.flatten(), reduction="none").view_as(labels)
        if cfg.position_weights == "dpace":
            weights = dpace_weights(nll.detach(), valid, cfg.dpace_alpha)
        if cfg.ce > 0:
            terms["ce"] = position_weighted_mean(nll, valid, weights)
    if cfg.fkl > 0:
        if teacher_logits is None:
            raise ValueError("the 'fkl' block loss needs the verifier's logits")
        kl = forward_kl_per_position(student_logits, teacher_logits, cfg.temperature)
        terms["fkl"] = position_weighted_mean(kl, valid, weights)
    total = sum(getattr(cfg, name) * value for name, value in terms.items())
    return total, terms


def dpace_weights(nll: torch.Tensor, valid: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE weights (…, L−1) from per-position CE (detached): with q_i = (1 − α)·exp(−CE_i) + α (1 where
    invalid), w_k = Σ_{j≥k} Π_{i≤j} q_i over valid j: the derivative of the block's expected accepted length
    Σ_j Π_{i≤j} q_i by log q_k, so CE·w follows acceptance length, and a position behind an unlikely
    prefix weighs little, whatever its index."""
    confidence = torch.where(valid, (1.0 - alpha) * torch.exp(-nll) + alpha, torch.ones_like(nll))
    reach = torch.cumprod(confidence, dim=-1) * valid
    return reach.flip(-1).cumsum(-1).flip(-1) * valid


def acceptance_rate(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Σ_v min(p_v, q_v) = 1 − TV(p, q) per position: the probability that rejection sampling accepts a draft
    from q against p, the confidence head's target (as the DSpark reference trains it)."""
    return 1.0 - total_variation(student_logits, teacher_logits, temperature)


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
