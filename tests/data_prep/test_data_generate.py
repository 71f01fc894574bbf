"""Batched verifier continuation: equal to one-at-a-time and to HF generate, stops, seeded sampling."""

from __future__ import annotations

import pytest
import torch

from data_prep.continuation import generate_batch
from pipeline.config.sampling_config import SamplingConfig
from tests.support.tiny_models import tiny_qwen3, tiny_tokenizer

TEXTS = ["def add(a, b):", "The quick brown fox jumps over", "import os\nfor i in range(", "x",
         "class Stack:\n    def push(self, item):\n        self.items", "Speculative decoding drafts"]


@pytest.fixture(scope="module")
def model_and_prompts():
    tokenizer = tiny_tokenizer()
    model = tiny_qwen3(len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    assert len({len(p) for p in prompts}) > 3  # really different lengths, so left padding is exercised
    return model, tokenizer, prompts


def run(model, tokenizer, prompts, **kwargs):
    kwargs.setdefault("eos_token_id", tokenizer.eos_token_id)
    return generate_batch(model, prompts, max_new_tokens=kwargs.pop("max_new_tokens", 10),
                          pad_token_id=tokenizer.pad_token_id, **kwargs)


def test_batched_greedy_equals_one_at_a_time_and_hf_generate(model_and_prompts):
    model, tokenizer, prompts = model_and_prompts
    batched = run(model, tokenizer, prompts)
    single = [run(model, tokenizer, [prompt])[0] for prompt in prompts]
    assert batched == single
    for prompt, continuation in zip(prompts, single):
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        assert continuation.response_ids == reference[0, len(prompt):].tolist()
        assert continuation.finish_reason == "length" and len(continuation.response_ids) == 10


def test_eos_stops_one_row_while_the_others_continue(model_and_prompts):
    model, tokenizer, prompts = model_and_prompts
    free_run = run(model, tokenizer, prompts)
    stop_token = free_run[0].response_ids[2]  # make row 0's third token the EOS
    stopped = run(model, tokenizer, prompts, eos_token_id=stop_token)
    first = stopped[0]
    assert first.finish_reason == "eos" and first.response_ids[-1] == stop_token
    assert first.response_ids == free_run[0].response_ids[: len(first.response_ids)] and len(first.response_ids) <= 3
    for before, after in zip(free_run, stopped):
        if stop_token not in before.response_ids:
            assert after == before


def test_sampling_is_seeded_per_prompt_not_per_batch(model_and_prompts):
    model, tokenizer, prompts = model_and_prompts
    sampling = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95)
    seeds = [11, 12, 13, 14, 15, 16][: len(prompts)]
    batched = run(model, tokenizer, prompts, sampling=sampling, seeds=seeds)
    single = [run(model, tokenizer, [p], sampling=sampling, seeds=[s])[0] for p, s in zip(prompts, seeds)]
    assert batched == single
    reseeded = run(model, tokenizer, prompts, sampling=sampling, seeds=[s + 100 for s in seeds])
    assert reseeded != batched
    greedy = run(model, tokenizer, prompts)
    top1 = run(model, tokenizer, prompts, sampling=SamplingConfig(temperature=0.7, top_k=1), seeds=seeds)
    assert top1 == greedy


