"""Decoding loops: exact greedy equality with the baseline, and KV caches equal to a fresh prefill."""


import pytest
import torch
from transformers import DynamicCache

from pipeline.drafters.ar.decoding import ARProposer, TorchARDrafter
from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer
from pipeline.drafters.speculative_loop import decode
from tests.support.decoding import VOCAB, baseline, block_model
from tests.support.tiny_models import tiny_qwen3

PROMPTS = [[5, 17, 33], [1, 2, 3, 4, 5, 6, 7, 8, 9], [42], [90, 12, 12, 12, 60, 3]]


@pytest.fixture(scope="module")
def verifier():
    return tiny_qwen3(VOCAB, hidden_size=32, num_layers=3, seed=0)


@pytest.fixture(scope="module")
def random_drafter():
    return tiny_qwen3(VOCAB, hidden_size=32, num_layers=1, seed=7)


def ar(verifier, drafter_model, k):
    return ARProposer(TorchARDrafter(drafter_model), k)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_ar_greedy_equals_baseline(verifier, random_drafter, k):
    for drafter_model in (random_drafter, verifier):  # mostly rejected / always accepted
        for prompt in PROMPTS:
            expected = baseline(verifier, prompt, 13)
            got = decode(verifier, prompt, 13, proposer=ar(verifier, drafter_model, k))
            assert got.new_ids == expected
            assert sum(step.committed for step in got.steps) == 13


def test_ar_with_the_verifier_as_drafter_accepts_everything(verifier):
    got = decode(verifier, PROMPTS[1], 12, proposer=ar(verifier, verifier, 3))
    assert got.accepted == got.drafted and got.tau == 12 / 3  # 3 forwards of (3 drafts + bonus)


def eos_inside_a_block(verifier, prompt, index):
    """A token the greedy baseline emits at `index` (first occurrence), used as EOS."""
    free = baseline(verifier, prompt, 20)
    eos = free[index]
    return eos, free[: free.index(eos) + 1]


@pytest.mark.parametrize("k", [2, 4])
def test_ar_stops_at_eos_inside_a_block(verifier, k):
    for prompt in PROMPTS[:2]:
        eos, expected = eos_inside_a_block(verifier, prompt, 6)
        got = decode(verifier, prompt, 20, proposer=ar(verifier, verifier, k), eos_token_id=eos)
        assert got.new_ids == expected == baseline(verifier, prompt, 20, eos)
        assert got.finish_reason == "eos"


@pytest.mark.parametrize("block_size", [2, 4, 6])
def test_block_greedy_equals_baseline(verifier, block_size):
    drafter = BlockDrafter(block_model(verifier, block_size), verifier)
    for prompt in PROMPTS:
        for max_new in (1, 7, 11):  # 7 and 11 end inside a block
            got = decode(verifier, prompt, max_new, proposer=BlockProposer(drafter))
            assert got.new_ids == baseline(verifier, prompt, max_new)
            assert got.steps[0].drafted == 0  # the prefill forward has no features to draft from
            assert all(step.drafted <= block_size - 1 for step in got.steps)


def test_block_stops_at_eos(verifier):
    drafter = BlockDrafter(block_model(verifier, 4), verifier)
    eos, expected = eos_inside_a_block(verifier, PROMPTS[0], 5)
    got = decode(verifier, PROMPTS[0], 20, proposer=BlockProposer(drafter), eos_token_id=eos)
    assert got.new_ids == expected and got.finish_reason == "eos"


def fresh_prefill_cache(model, tokens):
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True)
    return cache


def assert_same_cache(cache, fresh):
    assert cache.get_seq_length() == fresh.get_seq_length()
    for layer, fresh_layer in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(layer.keys, fresh_layer.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(layer.values, fresh_layer.values, atol=1e-5, rtol=1e-4)


def test_caches_end_equal_to_a_fresh_prefill(verifier, random_drafter):
    backend = TorchARDrafter(random_drafter)
    proposer = ARProposer(backend, 4)
    got = decode(verifier, PROMPTS[1], 15, proposer=proposer)
    committed = got.prompt_ids + got.new_ids
    assert_same_cache(got.verifier_cache, fresh_prefill_cache(verifier, committed[:-1]))
    # after syncing to the committed tokens (what the next step does first) the drafter cache holds
    # a committed prefix (a fully accepted step leaves the last draft unfed), exactly as a prefill would
    proposer.sync(committed)
    cached = proposer.cached
    assert len(cached) >= len(committed) - 3 and cached == committed[: len(cached)]
    assert_same_cache(backend.cache, fresh_prefill_cache(random_drafter, cached))


def test_block_context_equals_fresh_features(verifier):
    model = block_model(verifier, 4)
    drafter = BlockDrafter(model, verifier)
    got = decode(verifier, PROMPTS[3], 10, proposer=BlockProposer(drafter))
    committed = got.prompt_ids + got.new_ids
    assert drafter.context_length == len(committed) - 1
    fresh = BlockDrafter(model, verifier)
    with torch.inference_mode():
        out = verifier(input_ids=torch.tensor([committed[:-1]]), output_hidden_states=True)
    fresh.extend(out.hidden_states, 0, len(committed) - 1)
    anchor = (committed[-1], len(committed) - 1)
    torch.testing.assert_close(drafter.draft(*anchor)[0], fresh.draft(*anchor)[0])


def test_sampled_loops_are_reproducible_with_a_seed(verifier, random_drafter):
    from pipeline.config.sampling_config import SamplingConfig

    def run(seed):
        return decode(verifier, PROMPTS[0], 12, proposer=ar(verifier, random_drafter, 3),
                      sampling=SamplingConfig(temperature=0.8), generator=torch.Generator().manual_seed(seed)).new_ids

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_block_drafts_at_temperature_come_with_their_distribution(verifier):
    """Sampled block drafts: each draft is a sample of the q row returned with it (what rejection
    sampling needs), and at T > 0 the drafts are not just the argmax."""
    from pipeline.config.sampling_config import SamplingConfig

    model = block_model(verifier, 4, seed=2)
    proposer = BlockProposer(BlockDrafter(model, verifier))
    tokens = PROMPTS[0]
    with torch.inference_mode():
        out = verifier(input_ids=torch.tensor([tokens[:-1]]), output_hidden_states=True)
    proposer.observe(out.hidden_states, 0, len(tokens) - 1)
    greedy, none = proposer.propose(tokens, 3, SamplingConfig(), None)
    assert none is None and len(greedy) == 3
    generator = torch.Generator().manual_seed(0)
    seen_other = False
    for _ in range(20):
        drafts, q = proposer.propose(tokens, 3, SamplingConfig(temperature=1.5), generator)
        assert q.shape == (3, verifier.config.vocab_size)
        torch.testing.assert_close(q.sum(-1), torch.ones(3))
        assert all(float(q[i, token]) > 0 for i, token in enumerate(drafts))
        seen_other |= drafts != greedy
    assert seen_other
