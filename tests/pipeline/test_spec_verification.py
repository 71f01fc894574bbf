"""Verification functions: greedy prefix acceptance, warping, and losslessness of rejection sampling."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from pipeline.config.sampling_config import SamplingConfig
from pipeline.sampling import draw, greedy_accept, rejection_accept, warp_probs


def one_hot_logits(ids, vocab=6):
    logits = torch.zeros(len(ids), vocab)
    logits[torch.arange(len(ids)), torch.tensor(ids)] = 5.0
    return logits


def test_greedy_accepts_longest_matching_prefix_and_appends_correction():
    target = one_hot_logits([1, 2, 3, 4])
    assert greedy_accept([1, 2, 0], target) == (2, 3)
    assert greedy_accept([0, 2, 3], target) == (0, 1)


def test_greedy_full_acceptance_appends_bonus_token():
    assert greedy_accept([1, 2, 3], one_hot_logits([1, 2, 3, 4])) == (3, 4)
    assert greedy_accept([], one_hot_logits([5])) == (0, 5)


def test_warp_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    top_k = warp_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(top_k, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    top_p = warp_probs(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    assert torch.allclose(top_p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert warp_probs(logits, SamplingConfig(temperature=1.0, top_p=0.4)).tolist() == [1.0, 0.0, 0.0, 0.0]
    sharp = warp_probs(logits, SamplingConfig(temperature=0.5))
    assert sharp[0] > 0.5 and torch.isclose(sharp.sum(), torch.tensor(1.0))


def test_draw_samples_each_row_from_its_distribution_and_never_a_zero():
    # rows drawn together, as a DFlash block is; zeros at both ends and inside, unnormalised rows (the mass is
    # read off the cumulative sum), and a row whose only mass is its last index (u = 1 reaches exactly there)
    probs = torch.tensor([[0.0, 0.2, 0.0, 0.5, 0.3, 0.0],
                          [2.0, 0.0, 1.0, 0.0, 0.0, 1.0],
                          [0.0, 0.0, 0.0, 0.0, 0.0, 7.0]])
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([draw(probs, generator) for _ in range(6000)])
    assert draws.shape == (6000, 3) and draws.dtype == torch.long
    for row in range(3):
        counts = torch.bincount(draws[:, row], minlength=6).double()
        expected = probs[row].double() / probs[row].sum() * len(draws)
        assert (counts[expected == 0] == 0).all(), f"row {row} drew a token of probability 0"
        kept = expected > 0
        if kept.sum() > 1:
            assert chisquare(counts[kept].numpy(), expected[kept].numpy()).pvalue > 1e-3
    assert draw(torch.tensor([0.0, 1.0, 0.0]), generator).shape == ()


# ---------------------------------------------------------------- chi-square: joint over two positions

V = 4
rng = np.random.default_rng(0)
P1 = torch.tensor([0.4, 0.3, 0.2, 0.1])
P2 = torch.tensor(rng.dirichlet(np.ones(V), size=V), dtype=torch.float32)  # P2[a] = p(x2 | x1=a)
P3 = torch.full((V, V, V), 1.0 / V)  # bonus distribution (not under test)


def two_token_trial(p1, q1, q2, generator, one_hot):
    """One speculative step with two drafts (sampled from q, or fixed argmax drafts) against p."""
    if one_hot:
        d1 = int(torch.argmax(q1))
        d2 = int(torch.argmax(q2[d1]))
        draft_probs = None
    else:
        d1 = int(torch.multinomial(q1, 1, generator=generator))
        d2 = int(torch.multinomial(q2[d1], 1, generator=generator))
        draft_probs = torch.stack([q1, q2[d1]])
    target = torch.stack([p1, P2[d1], P3[d1, d2]])
    accepted, token = rejection_accept([d1, d2], target, draft_probs, generator)
    tokens = [d1, d2][:accepted] + [token]
    if len(tokens) == 1:  # the second position comes from the verifier's next step
        tokens.append(int(torch.multinomial(P2[tokens[0]], 1, generator=generator)))
    return tokens[0], tokens[1]


Q_OTHER = torch.tensor([0.1, 0.2, 0.3, 0.4])
Q2_OTHER = torch.tensor(rng.dirichlet(np.ones(V), size=V), dtype=torch.float32)
CASES = {  # name: (p1, q1, q2, one_hot)
    "q_equals_p": (P1, P1, P2, False),
    "q_differs": (P1, Q_OTHER, Q2_OTHER, False),
    # the verifier gives zero mass to the tokens the drafter likes most
    "p_zero_where_q_positive": (torch.tensor([0.6, 0.4, 0.0, 0.0]), Q_OTHER, Q2_OTHER, False),
    "one_hot_q": (P1, Q_OTHER, P2.flip(-1), True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejection_sampling_output_matches_verifier_joint(case):
    p1, q1, q2, one_hot = CASES[case]
    generator = torch.Generator().manual_seed(1)
    trials = 12000
    counts = np.zeros((V, V))
    for _ in range(trials):
        a, b = two_token_trial(p1, q1, q2, generator, one_hot)
        counts[a, b] += 1
    expected = (p1[:, None] * P2).double().numpy()
    expected = expected / expected.sum() * trials
    support = expected > 0
    assert counts[~support].sum() == 0, "a token with p = 0 was emitted"
    _, p_value = chisquare(counts[support], expected[support])
    assert p_value > 1e-3, f"{case}: joint distribution differs from the verifier's (p={p_value:.2g})"


def test_chi_square_detects_a_biased_sampler():
    """Guard against a vacuous test: committing the draft unconditionally is not lossless."""
    generator = torch.Generator().manual_seed(2)
    counts = np.zeros(V)
    for _ in range(4000):
        counts[int(torch.multinomial(Q_OTHER, 1, generator=generator))] += 1
    expected = P1.double().numpy()
    _, p_value = chisquare(counts, expected / expected.sum() * 4000)
    assert p_value < 1e-6
