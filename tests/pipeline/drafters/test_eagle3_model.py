"""The EAGLE-3 head: training-time test computes exactly what step-by-step drafting computes, the
reduced draft vocabulary maps back by vLLM's d2t convention, and the proposer is lossless in the loop."""

from __future__ import annotations

import pytest
import torch

from pipeline.config.sampling_config import SamplingConfig
from pipeline.drafters.eagle3.config import Eagle3DrafterConfig, default_aux_layer_ids
from pipeline.drafters.eagle3.decoding import Eagle3Proposer, TorchEagle3Head
from pipeline.drafters.eagle3.lightning import to_draft_ids
from pipeline.drafters.eagle3.model import (
    Eagle3Cache,
    build_drafter,
    draft_vocabulary,
)
from pipeline.drafters.speculative_loop import decode
from pipeline.errors import DraftlineError
from tests.support.tiny_models import tiny_qwen3

VOCAB = 64


@pytest.fixture(scope="module")
def verifier():
    return tiny_qwen3(VOCAB, num_layers=6)


def head(verifier, draft_vocab_size=None, **overrides):
    sequences = [list(range(0, VOCAB, 2))] * 3 + [list(range(VOCAB))]
    cfg = Eagle3DrafterConfig(draft_vocab_size=draft_vocab_size, **overrides)
    return build_drafter(verifier, cfg, sequences, seed=0).eval()


def test_default_aux_layers_follow_vllm_and_stay_distinct_on_shallow_verifiers():
    assert default_aux_layer_ids(32) == [2, 16, 29]  # vLLM's (2, n // 2, n - 3)
    assert default_aux_layer_ids(6) == [1, 3, 5]  # (2, 3, 3) would repeat a layer
    assert default_aux_layer_ids(2) == [1]
    for depth in range(2, 40):
        ids = default_aux_layer_ids(depth)
        assert len(set(ids)) == len(ids) and all(1 <= i < depth for i in ids)
    with pytest.raises(DraftlineError, match="out of range"):
        head(tiny_qwen3(VOCAB, num_layers=4), aux_layer_ids=[1, 4])


def test_draft_vocabulary_is_the_most_frequent_tokens_and_d2t_holds_offsets(verifier):
    assert draft_vocabulary([[5, 5, 5, 9, 9, 2]], 16, 3).tolist() == [2, 5, 9]
    assert draft_vocabulary([[7]], 16, 3).tolist() == [0, 1, 7]  # unseen ids fill up by id
    model = head(verifier, draft_vocab_size=40)
    ids = model.draft_ids
    # every even id is frequent; the 8 left are the first odd ids (seen once each)
    assert ids.tolist() == sorted([*range(0, VOCAB, 2), *range(1, 17, 2)])
    assert torch.equal(model.d2t, ids - torch.arange(40))  # vLLM: target id = draft id + d2t[draft id]
    assert model.t2d.sum() == 40 and model.t2d[ids].all()
    # the LM head starts as the verifier's rows of those ids
    assert torch.equal(model.lm_head.weight, verifier.lm_head.weight[ids])
    draft_logits = torch.randn(2, 40)
    full = model.full_vocab_logits(draft_logits)
    assert torch.equal(full[:, ids], draft_logits) and torch.isinf(full[:, ~model.t2d]).all()
    outside = int((~model.t2d).nonzero()[0])
    labels, inside = to_draft_ids(model, torch.tensor([int(ids[7]), outside]))
    assert labels[0] == 7 and inside.tolist() == [True, False]


@pytest.mark.parametrize("draft_vocab_size", [None, 40])
def test_training_time_test_equals_step_by_step_drafting(verifier, draft_vocab_size):
    """Step j of the unrolled training forward at index t = draft j+1 after committing positions <= t."""
    model = head(verifier, draft_vocab_size)
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # right padding must not leak into the unpadded row's numbers
    embed = verifier.get_input_embeddings()
    with torch.no_grad():
        hidden = verifier(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        unrolled = model(model.aux_hidden(hidden), ids, mask, embed, steps=3)
        for row, t in ((0, 2), (0, 7), (1, 5)):
            cache = Eagle3Cache()
            features = model.fc(model.aux_hidden(hidden))[row: row + 1, : t + 1]
            state = model.step(cache, features, ids[row: row + 1, 1: t + 2], 0, embed)[:, -1:]
            for j in range(3):
                torch.testing.assert_close(model.logits(state)[0, -1], unrolled[j][row, t], atol=1e-5, rtol=1e-4)
                state = model.step(cache, state, ids[row: row + 1, t + j + 2: t + j + 3], t + j + 1, embed)


@pytest.mark.parametrize("draft_vocab_size", [None, 40])
def test_greedy_drafting_keeps_the_verifier_output(verifier, draft_vocab_size):
    proposer = Eagle3Proposer(TorchEagle3Head(head(verifier, draft_vocab_size), verifier), draft_tokens=3)
    prompt = [3, 9, 27, 17, 51]
    plain = decode(verifier, prompt, 24)
    speculative = decode(verifier, prompt, 24, proposer=proposer)
    assert speculative.new_ids == plain.new_ids
    assert speculative.drafted > 0 and all(step.drafted <= 3 for step in speculative.steps)
    sampled = decode(verifier, prompt, 24, proposer=proposer, sampling=SamplingConfig(temperature=0.8),
                     generator=torch.Generator().manual_seed(0))
    assert len(sampled.new_ids) == 24
