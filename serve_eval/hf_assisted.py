"""Peer baseline: Hugging Face assisted generation (`generate(assistant_model=...)`), greedy."""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel


@torch.inference_mode()
def hf_assisted_generate(verifier: PreTrainedModel, drafter: PreTrainedModel, prompt_ids: list[int],
                         max_new_tokens: int, draft_tokens: int, eos_token_id: list[int]) -> tuple[list[int], float]:
    """New token ids and wall seconds; a constant k and no confidence early-exit, like our AR loop."""
    input_ids = torch.tensor([prompt_ids], device=verifier.device)
    started = time.perf_counter()
    out = verifier.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        assistant_model=drafter,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        num_assistant_tokens=draft_tokens,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id[0] if eos_token_id else None,
    )
    if verifier.device.type == "cuda":
        torch.cuda.synchronize(verifier.device)
    return out[0, len(prompt_ids):].tolist(), time.perf_counter() - started
