"""The decoding loop with KV caches, batch size 1: the verifier alone (baseline) or speculative with
any drafter kind's proposer (`pipeline/drafters/<kind>/decoding.py`).

Both run the same `decode` loop over one verifier KV cache, so the baseline uses exactly the
cache code the speculative loops use. Invariant between steps: the verifier cache holds every
committed token except the last one, which is fed at the start of the next verifier forward
together with the drafts. A rejection crops the cache back; accepted prefixes are never recomputed.

Design: docs/algorithms.md#speculative-decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection

import torch
from transformers import DynamicCache, PreTrainedModel

from pipeline.config.sampling_config import SamplingConfig
from pipeline.drafters.proposer import Proposer
from pipeline.kv_cache import crop_cache
from pipeline.sampling import greedy_accept, rejection_accept, stop_set, warp_probs


@dataclass
class Step:
    """One verifier forward."""

    drafted: int
    accepted: int
    committed: int  # tokens appended by this step (accepted drafts + correction/bonus, cut at EOS/limit)
    draft_s: float
    verify_s: float


@dataclass
class Generation:
    prompt_ids: list[int]
    new_ids: list[int]
    steps: list[Step] = field(default_factory=list)
    wall_s: float = 0.0
    finish_reason: str = "length"  # "eos" | "length"
    verifier_cache: DynamicCache | None = None  # final state, for checks against a fresh prefill

    @property
    def verifier_forwards(self) -> int:
        return len(self.steps)

    @property
    def drafted(self) -> int:
        return sum(step.drafted for step in self.steps)

    @property
    def accepted(self) -> int:
        return sum(step.accepted for step in self.steps)

    @property
    def tau(self) -> float:
        """Mean tokens committed per verifier forward, bonus/correction token included."""
        return len(self.new_ids) / max(1, self.verifier_forwards)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def decode(
    verifier: PreTrainedModel,
    prompt_ids: list[int],
    max_new_tokens: int,
    *,
    proposer: Proposer | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    eos_token_id: int | Collection[int] | None = None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Generate up to `max_new_tokens` after `prompt_ids`; `proposer=None` is plain verifier decoding."""
    if not prompt_ids:
        raise ValueError("decode needs at least one prompt token")
    device = verifier.device
    stops = stop_set(eos_token_id)
    tokens = list(prompt_ids)
    cache = DynamicCache(config=verifier.config)
    result = Generation(prompt_ids=list(prompt_ids), new_ids=[])
    if proposer is not None:
        proposer.reset()
    wants_hidden = proposer is not None and proposer.uses_hidden_states
    _sync(device)
    started = time.perf_counter()
    while len(result.new_ids) < max_new_tokens:
        remaining = max_new_tokens - len(result.new_ids)
        t0 = time.perf_counter()
        drafts, draft_probs = [], None
        if proposer is not None and remaining > 1:
            drafts, draft_probs = proposer.propose(tokens, min(proposer.draft_tokens, remaining - 1),
                                                   sampling, generator)
        _sync(device)
        t1 = time.perf_counter()

        first_position = cache.get_seq_length()
        fed = tokens[first_position:] + drafts
        out = verifier(input_ids=torch.tensor([fed], device=device), cache=cache, use_cache=True,
                       logits_to_keep=len(drafts) + 1, output_hidden_states=wants_hidden)
        logits = out.logits[0]
        if sampling.greedy:
            accepted, next_token = greedy_accept(drafts, logits)
        else:
            accepted, next_token = rejection_accept(drafts, warp_probs(logits, sampling), draft_probs, generator)
        new = drafts[:accepted] + [next_token]  # at most `remaining`: k <= remaining - 1
        ends = [index for index, token in enumerate(new) if token in stops]
        if ends:
            new = new[: ends[0] + 1]
            result.finish_reason = "eos"
        tokens.extend(new)
        result.new_ids.extend(new)
        crop_cache(cache, len(tokens) - 1)
        _sync(device)
        t2 = time.perf_counter()
        if wants_hidden:
            # features of the committed positions the verifier just saw: all of `fed` up to the new anchor
            proposer.observe(out.hidden_states, first_position, len(tokens) - 1 - first_position)
            _sync(device)
        t3 = time.perf_counter()
        result.steps.append(Step(drafted=len(drafts), accepted=accepted, committed=len(new),
                                 draft_s=(t1 - t0) + (t3 - t2), verify_s=t2 - t1))
        if result.finish_reason == "eos":
            break
    result.wall_s = time.perf_counter() - started
    result.verifier_cache = cache
    return result
