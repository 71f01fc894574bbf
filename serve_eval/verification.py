"""Draft verification: greedy prefix acceptance and lossless rejection sampling (DESIGN section 7).

Pure functions over one sequence (batch size 1). `target_logits` always has one row more than the
drafts: row i scores the token after draft i-1, and the last row gives the bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """Decoding settings shared by verifier and drafter, so p and q are warped the same way."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def warp_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), then softmax, over the last dim (float32)."""
    logits = logits.float() / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def greedy_accept(draft_ids: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Longest prefix where draft == verifier argmax; returns (accepted, correction-or-bonus token)."""
    target_ids = target_logits.argmax(-1).tolist()
    accepted = 0
    while accepted < len(draft_ids) and draft_ids[accepted] == target_ids[accepted]:
        accepted += 1
    return accepted, target_ids[accepted]


def rejection_accept(
    draft_ids: list[int],
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Leviathan/Chen speculative sampling; the committed tokens are distributed exactly as under p.

    Accept draft x_i with probability min(1, p_i(x)/q_i(x)); on the first rejection sample from
    norm(max(0, p_i - q_i)); after full acceptance sample the bonus token from p_{k+1}.
    `draft_probs=None` means one-hot q (an argmax draft): accept with probability p_i(x) and resample
    from p_i with x removed.
    """
    uniforms = torch.rand(len(draft_ids), generator=generator).tolist()
    for i, token in enumerate(draft_ids):
        p = target_probs[i]
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[token] = 1.0
        else:
            q = draft_probs[i]
        q_token = float(q[token])
        if q_token > 0 and uniforms[i] < float(p[token]) / q_token:
            continue
        residual = (p - q).clamp_min(0.0)
        mass = float(residual.sum())
        # p <= q everywhere only when p == q up to rounding; then rejection had probability ~0 anyway
        return i, sample(residual / mass if mass > 0 else p, generator)
    return len(draft_ids), sample(target_probs[len(draft_ids)], generator)
