"""Sampling and draft verification, the one place both live (docs/algorithms.md#speculative-decoding).

`warp_probs` is the distribution every sampler in draftline draws from (corpus generation, drafters,
the verifier in speculative decoding), so p and q are always warped the same way. Verification runs
over one sequence: `target_logits`/`target_probs` have one row more than the drafts (row i scores the
token after draft i−1, the last row gives the bonus token). Acceptance is decided for all drafts at
once (as gpt-fast does), with one host sync per verifier step instead of one per draft.
"""

from __future__ import annotations

from typing import Collection

import torch

from pipeline.config.sampling_config import SamplingConfig


def stop_set(eos_token_id: int | Collection[int] | None) -> frozenset[int]:
    """Ids that end generation: one eos id, or all of a verifier's (`integrity.stop_token_ids`)."""
    if eos_token_id is None:
        return frozenset()
    return frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)


def warp_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), then softmax, over the last dim (float32)."""
    logits = logits.float() / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of `probs` (..., V), index v with probability probs[v] / the row's sum: the first index
    whose cumulative mass reaches u · sum for u uniform on (0, 1] (inverse transform sampling).

    Exact up to float64 sums, and never an index of zero probability (the mass has to grow at an index for it
    to be the first to reach a positive value). `torch.multinomial` draws the same distribution, but its CPU
    kernel draws V exponentials per row: a DSpark block drafts 7 tokens one by one, and drawing them took ~0.3 ms
    of a ~4 ms decoding step (one row 27 µs against 10 µs here; 7 rows at once 145 µs against 15 µs; V = 1024,
    2 AVX2 cores)."""
    cdf = probs.double().cumsum(-1)
    uniform = 1.0 - torch.rand(cdf.shape[:-1] + (1,), generator=generator, dtype=torch.float64).to(cdf.device)
    return torch.searchsorted(cdf, uniform * cdf[..., -1:]).squeeze(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One token id from a distribution over the vocabulary (V,)."""
    return int(draw(probs, generator))


def greedy_accept(draft_ids: list[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Longest prefix where draft == verifier argmax; returns (accepted, correction-or-bonus token)."""
    target_ids = target_logits.argmax(-1)
    drafts = torch.tensor(draft_ids, dtype=torch.long, device=target_ids.device)
    mismatched = (drafts != target_ids[: len(draft_ids)]).long()
    # cumsum == 0 exactly on the matching prefix
    accepted = int((mismatched.cumsum(0) == 0).sum())
    return accepted, int(target_ids[accepted])


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
    k = len(draft_ids)
    uniforms = torch.rand(k, generator=generator).to(target_probs.device)
    if k == 0:
        return 0, sample(target_probs[0], generator)
    drafts = torch.tensor(draft_ids, dtype=torch.long, device=target_probs.device)
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(drafts, target_probs.shape[-1]).to(target_probs.dtype)
    p = target_probs[:k].gather(-1, drafts[:, None]).squeeze(-1)
    q = draft_probs.gather(-1, drafts[:, None]).squeeze(-1)
    accepted_each = (q > 0) & (uniforms * q < p)
    rejected = (~accepted_each).nonzero()
    if len(rejected) == 0:
        return k, sample(target_probs[k], generator)
    first = int(rejected[0])
    residual = (target_probs[first] - draft_probs[first]).clamp_min(0.0)
    mass = float(residual.sum())
    # p <= q everywhere only when p == q up to rounding; then rejection had probability ~0 anyway
    return first, sample(residual / mass if mass > 0 else target_probs[first], generator)
