"""SamplingConfig (T > 0) through the real loops: the output distribution equals the verifier's (chi-square)."""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from pipeline.config.sampling_config import SamplingConfig
from pipeline.drafters.ar.decoding import ARProposer, TorchARDrafter
from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer
from pipeline.drafters.eagle3.config import Eagle3DrafterConfig
from pipeline.drafters.eagle3.decoding import Eagle3Proposer, TorchEagle3Head
from pipeline.drafters.eagle3.model import build_drafter as build_eagle3
from pipeline.drafters.speculative_loop import decode
from pipeline.sampling import warp_probs
from tests.support.decoding import block_model
from tests.support.tiny_models import tiny_qwen3

VOCAB = 5
PROMPT = [1, 3, 0]
SAMPLING = SamplingConfig(temperature=1.0)


def peaky(model, scale):
    """Sharpen a random model's next-token distribution so drafter and verifier clearly differ."""
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def verifier():
    return peaky(tiny_qwen3(VOCAB, hidden_size=16, num_layers=2, seed=3), 4.0)


def next_probs(verifier, tokens):
    with torch.inference_mode():
        return warp_probs(verifier(input_ids=torch.tensor([tokens])).logits[0, -1], SAMPLING)


def exact_joint(verifier, skip: int):
    """p(x_{skip+1}, x_{skip+2} | prompt) by enumeration, marginalising the first `skip` tokens."""
    joint = np.zeros((VOCAB, VOCAB))
    for prefix in itertools.product(range(VOCAB), repeat=skip):
        weight = 1.0
        for i, token in enumerate(prefix):
            weight *= float(next_probs(verifier, PROMPT + list(prefix[:i]))[token])
        first = next_probs(verifier, PROMPT + list(prefix)).double().numpy()
        for a in range(VOCAB):
            second = next_probs(verifier, PROMPT + list(prefix) + [a]).double().numpy()
            joint[a] += weight * first[a] * second
    return joint / joint.sum()


def sampled_joint(verifier, proposer, skip, trials, seed):
    generator = torch.Generator().manual_seed(seed)
    counts = np.zeros((VOCAB, VOCAB))
    for _ in range(trials):
        out = decode(verifier, PROMPT, skip + 2, proposer=proposer, sampling=SAMPLING, generator=generator)
        counts[out.new_ids[skip], out.new_ids[skip + 1]] += 1
    return counts


def assert_matches(counts, joint):
    expected = joint * counts.sum()
    keep = expected > 1e-9
    _, p_value = chisquare(counts[keep], expected[keep] / expected[keep].sum() * counts[keep].sum())
    assert p_value > 1e-3, f"sampled joint differs from the verifier's (p={p_value:.2g})"


@pytest.mark.slow
def test_ar_loop_samples_the_verifier_joint(verifier):
    # q = p and one-hot q are covered on synthetic distributions in test_spec_verification.py
    drafter = peaky(tiny_qwen3(VOCAB, hidden_size=16, num_layers=1, seed=11), 4.0)
    proposer = ARProposer(TorchARDrafter(drafter), 2)
    counts = sampled_joint(verifier, proposer, 0, 500, seed=0)
    assert_matches(counts, exact_joint(verifier, 0))


@pytest.mark.slow
def test_block_loop_with_sampled_drafts_samples_the_verifier_joint(verifier):
    """The block drafter samples each position from its own q at T > 0 (one-hot q is covered on
    synthetic distributions in test_spec_verification.py)."""
    proposer = BlockProposer(BlockDrafter(block_model(verifier, 3, seed=5), verifier))
    # the first token comes from the prefill forward; tokens 2-3 are drafted as one block
    counts = sampled_joint(verifier, proposer, 1, 400, seed=1)
    assert_matches(counts, exact_joint(verifier, 1))


def dspark_proposer(verifier, confidence_threshold: float) -> BlockProposer:
    """A DSpark block drafter (strong random Markov head, confidence head) for the chi-square tests."""
    model = block_model(verifier, 4, seed=5, markov_rank=4, confidence=True)
    with torch.no_grad():
        model.confidence_head.proj.weight.normal_(0.0, 1.0)
    return BlockProposer(BlockDrafter(model, verifier), confidence_threshold)


def chained_joint(verifier, proposer, trials, seed):
    """Tokens 2-3 when both are drafts of one step: token 1 comes from the prefill forward, then a block
    of up to 3 drafts (a cut block: fewer) of which tokens 2 and 3 are the first two."""
    generator = torch.Generator().manual_seed(seed)
    counts = np.zeros((VOCAB, VOCAB))
    for _ in range(trials):
        out = decode(verifier, PROMPT, 4, proposer=proposer, sampling=SAMPLING, generator=generator)
        counts[out.new_ids[1], out.new_ids[2]] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("threshold", [0.0, 0.3])
def test_dspark_loop_drafting_through_the_markov_head_samples_the_verifier_joint(verifier, threshold):
    """Draft 2 is sampled from the Markov-biased q conditioned on draft 1, and q is returned per position;
    with a confidence threshold some blocks are cut after 0-2 drafts (the length depends on the drafts)."""
    counts = chained_joint(verifier, dspark_proposer(verifier, threshold), 400, seed=4)
    assert_matches(counts, exact_joint(verifier, 1))


def test_the_chi_square_check_rejects_a_markov_chain_verified_against_the_wrong_q(verifier, monkeypatch):
    """The test above can fail: returning the parallel pass's q (without the Markov bias) for drafts that
    were sampled through the Markov head makes rejection sampling lossy, and the check sees it."""
    proposer = dspark_proposer(verifier, 0.0)
    original = proposer.markov_chain

    def wrong_q(logits, hidden, anchor_id, sampling, generator):
        drafts, _ = original(logits, hidden, anchor_id, sampling, generator)
        return drafts, None if not drafts else warp_probs(logits[: len(drafts)], sampling)

    monkeypatch.setattr(proposer, "markov_chain", wrong_q)
    counts = chained_joint(verifier, proposer, 400, seed=4)
    with pytest.raises(AssertionError):
        assert_matches(counts, exact_joint(verifier, 1))


@pytest.mark.slow
def test_eagle3_loop_with_a_reduced_draft_vocabulary_samples_the_verifier_joint(verifier):
    """Two drafts per step, the second from the head's own state; the draft vocabulary leaves out
    two of the five tokens, so q is zero where p is not and only the residual can produce them."""
    cfg = Eagle3DrafterConfig(aux_layer_ids=[1], draft_vocab_size=3, draft_tokens=2)
    head = build_eagle3(verifier, cfg, [[0, 1, 2, 0, 1]], seed=7)
    with torch.no_grad():
        head.lm_head.weight.normal_(0.0, 2.0)  # far from the verifier's own rows
    proposer = Eagle3Proposer(TorchEagle3Head(head, verifier), draft_tokens=2)
    # the first token comes from the prefill forward; tokens 2-3 are the two drafts of one step
    counts = sampled_joint(verifier, proposer, 1, 400, seed=3)
    assert_matches(counts, exact_joint(verifier, 1))


def test_the_chi_square_check_rejects_a_wrong_distribution(verifier):
    generator = torch.Generator().manual_seed(2)
    counts = np.zeros((VOCAB, VOCAB))
    # sample at T = 2 but compare with the T = 1 joint; 800 draws reject it at p < 1e-9 for every seed tried
    # (0-5), 300 only for some
    for _ in range(800):
        out = decode(verifier, PROMPT, 2, sampling=SamplingConfig(temperature=2.0), generator=generator)
        counts[out.new_ids[0], out.new_ids[1]] += 1
    with pytest.raises(AssertionError):
        assert_matches(counts, exact_joint(verifier, 0))
