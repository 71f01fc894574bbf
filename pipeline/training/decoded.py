"""Real acceptance during validation: greedy speculative decoding of a few held-out prompts with the
drafter being trained, through the decoding loop evaluate and serving use."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from pipeline.drafters.proposer import Proposer
from pipeline.drafters.speculative_loop import decode


@torch.no_grad()
def decoded_acceptance(proposer: Proposer, verifier: nn.Module, prompts: Sequence[Sequence[int]],
                       max_new_tokens: int, eos_token_id: int | None) -> dict:
    """Real acceptance: greedy speculative decoding of `prompts` with `proposer` (the serving loop).

    `decode_tau` counts every verifier forward including the prefill (as `metrics/eval.json` does);
    `decode_tau_no_prefill` leaves the prefill forward and its token out, as the papers report τ.
    `decode_acceptance` is per position: the share of proposals accepting at least k tokens;
    `draft_ms_per_block` the drafter's wall time per proposal (context update included).
    """
    committed, forwards, draft_s, blocks = 0, 0, 0.0, 0
    drafted = [0] * proposer.draft_tokens
    accepted = [0] * proposer.draft_tokens
    for prompt in prompts:
        generation = decode(verifier, list(prompt), max_new_tokens, proposer=proposer, eos_token_id=eos_token_id)
        committed += len(generation.new_ids)
        forwards += generation.verifier_forwards
        for step in generation.steps:
            draft_s += step.draft_s if step.drafted else 0.0
            blocks += bool(step.drafted)
            for position in range(step.drafted):
                drafted[position] += 1
                accepted[position] += position < step.accepted
    return {
        "decode_tau": committed / max(1, forwards),
        "decode_tau_no_prefill": (committed - len(prompts)) / max(1, forwards - len(prompts)),
        "decode_acceptance": [a / d if d else 0.0 for a, d in zip(accepted, drafted)],
        "draft_ms_per_block": 1000 * draft_s / max(1, blocks),
    }


def decode_prompts(rows: Sequence[tuple[list[int], int]], count: int) -> list[list[int]]:
    """The prompts of `count` held-out rows spread over the split (rows are (tokens, prompt_len))."""
    if count <= 0 or not rows:
        return []
    stride = max(1, len(rows) // count)
    return [tokens[:prompt_len] for tokens, prompt_len in rows[::stride][:count]]
