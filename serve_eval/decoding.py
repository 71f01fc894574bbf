"""Decoding loops with KV caches, batch size 1: the verifier alone (baseline), AR speculative and
DFlash block speculative decoding.

All three run the same `decode` loop over one verifier KV cache, so the baseline uses exactly the
cache code the speculative loops use. Invariant between steps: the verifier cache holds every
committed token except the last one, which is fed at the start of the next verifier forward
together with the drafts. A rejection crops the cache back; accepted prefixes are never recomputed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from serve_eval.cache import crop_cache
from serve_eval.drafters import ARDraftBackend, BlockDrafter
from serve_eval.verification import Sampling, greedy_accept, rejection_accept, sample, warp_probs


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


class Proposer(Protocol):
    uses_hidden_states: bool

    def reset(self) -> None: ...

    def propose(self, tokens: list[int], k: int, sampling: Sampling,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        """Up to k draft tokens after `tokens`, and their proposal probabilities (k, V) (None: one-hot)."""

    def observe(self, hidden_states: tuple[torch.Tensor, ...], first_position: int, count: int) -> None:
        """Verifier features of `count` newly committed positions starting at `first_position`."""


class ARProposer:
    """k tokens from an AR drafter; its cache is synced to the committed tokens by common prefix."""

    uses_hidden_states = False

    def __init__(self, backend: ARDraftBackend, draft_tokens: int):
        self.backend = backend
        self.draft_tokens = draft_tokens
        self.cached: list[int] = []  # the token ids whose keys/values the backend holds

    def reset(self) -> None:
        self.backend.reset()
        self.cached = []

    def sync(self, tokens: list[int]) -> None:
        keep = 0
        limit = min(len(self.cached), len(tokens) - 1)  # the last token is always fed, for its logits
        while keep < limit and self.cached[keep] == tokens[keep]:
            keep += 1
        self.backend.crop(keep)
        del self.cached[keep:]

    def propose(self, tokens, k, sampling, generator):
        self.sync(tokens)
        pending = tokens[len(self.cached):]
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        for _ in range(k):
            logits = self.backend.forward(pending)
            self.cached.extend(pending)
            if sampling.greedy:
                token = int(logits.argmax())
            else:
                q = warp_probs(logits, sampling)
                token = sample(q, generator)
                probs.append(q)
            drafts.append(token)
            pending = [token]
        return drafts, (torch.stack(probs) if probs else None)

    def observe(self, hidden_states, first_position, count) -> None:
        """Never called (`uses_hidden_states` is False): the AR drafter keeps its own cache."""


class BlockProposer:
    """B-1 tokens in one DFlash drafter pass from cached verifier features (argmax, so q is one-hot)."""

    uses_hidden_states = True

    def __init__(self, drafter: BlockDrafter):
        self.drafter = drafter
        self.draft_tokens = drafter.block_size - 1

    def reset(self) -> None:
        self.drafter.reset()

    def propose(self, tokens, k, sampling, generator):
        if self.drafter.context_length == 0 or k == 0:
            return [], None  # the prefill forward has no features to draft from yet
        return self.drafter.draft(tokens[-1], len(tokens) - 1)[:k], None

    def observe(self, hidden_states, first_position, count) -> None:
        self.drafter.extend(hidden_states, first_position, count)


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
    sampling: Sampling = Sampling(),
    eos_token_id: int | None = None,
    generator: torch.Generator | None = None,
) -> Generation:
    """Generate up to `max_new_tokens` after `prompt_ids`; `proposer=None` is plain verifier decoding."""
    if not prompt_ids:
        raise ValueError("decode needs at least one prompt token")
    device = verifier.device
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
        if eos_token_id is not None and eos_token_id in new:
            new = new[: new.index(eos_token_id) + 1]
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
