"""Batched verifier continuation: left padding, one KV cache for the batch, EOS/max-new-token stops.

Rows that finish leave the batch (their KV cache rows are dropped). Greedy or sampled (temperature,
top-k, top-p); sampled rows draw from their own seeded generator, so
a prompt's continuation does not depend on which other prompts share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from pipeline.config.sampling_config import SamplingConfig
from pipeline.sampling import stop_set, warp_probs


@dataclass(frozen=True)
class Continuation:
    response_ids: list[int]  # includes the EOS token when finish_reason is 'eos'
    finish_reason: str  # 'eos' | 'length'


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
    return input_ids, attention_mask


def next_tokens(logits: torch.Tensor, sampling: SamplingConfig, generators: list[torch.Generator] | None) -> torch.Tensor:
    if sampling.greedy:
        return logits.argmax(dim=-1)
    probs = warp_probs(logits, sampling)
    return torch.cat([torch.multinomial(probs[row], 1, generator=generators[row]) for row in range(len(probs))])


@torch.inference_mode()
def generate_batch(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_token_id: int | Collection[int] | None,
    pad_token_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    seeds: Sequence[int] | None = None,
) -> list[Continuation]:
    """Continue every prompt (token ids) until EOS or `max_new_tokens`; one forward per new token."""
    if not prompts:
        return []
    if any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("every prompt needs at least one token")
    stops = stop_set(eos_token_id)
    generators = None
    if sampling.temperature > 0:
        seeds = list(seeds) if seeds is not None else list(range(len(prompts)))
        generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
    device = next(model.parameters()).device
    input_ids, attention_mask = (tensor.to(device) for tensor in left_pad(prompts, pad_token_id))
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    responses: list[list[int]] = [[] for _ in prompts]
    reasons = ["length"] * len(prompts)
    active = list(range(len(prompts)))  # original row of each row still in the batch
    for _ in range(max_new_tokens):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    cache=cache, use_cache=True, logits_to_keep=1)
        cache = out.cache
        tokens = next_tokens(out.logits[:, -1, :], sampling, generators)
        keep = []
        for row, token in enumerate(tokens.tolist()):
            responses[active[row]].append(token)
            if token in stops:
                reasons[active[row]] = "eos"
            else:
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(active):
            # finished rows leave the batch, so the rest stop paying for them
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            tokens, position_ids, attention_mask = tokens[index], position_ids[index], attention_mask[index]
            active = [active[row] for row in keep]
            generators = [generators[row] for row in keep] if generators else None
        input_ids = tokens[:, None]
        position_ids = position_ids[:, -1:] + 1
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1)
    return [Continuation(response, reason) for response, reason in zip(responses, reasons)]
