"""The DSpark kind (`train.dspark`: the block drafter with `markov_rank` > 0): the Markov head teacher-forced in
training is exactly the head chained in drafting, its bias at position k reads only the token at k − 1, a
fresh head leaves DFlash drafting unchanged, the confidence head trains on acceptance rates without
touching the drafter and cuts blocks at the threshold, greedy output stays the verifier's, and params
refuse what has no servable layout. (Losslessness at T > 0: tests/pipeline/drafters/test_spec_lossless.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.config.sampling_config import SamplingConfig
from pipeline.config.schema import parse_all
from pipeline.drafters.block import decoding
from pipeline.drafters.block.anchors import block_targets
from pipeline.drafters.block.config import BlockDrafterConfig
from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer
from pipeline.drafters.block.lightning import VerifierTargets, block_signals
from pipeline.drafters.block.losses import acceptance_rate, position_weights
from pipeline.drafters.block.model import DFlashDraftModel, verifier_parts
from pipeline.drafters.dspark.config import DSparkDrafterConfig
from pipeline.drafters.speculative_loop import decode
from pipeline.errors import DraftlineError, ParamsError
from pipeline.training.prompt_response_data import collate_rows
from tests.support.decoding import VOCAB, baseline, block_model
from tests.support.tiny_models import tiny_qwen3

PROMPTS = [[5, 9, 2, 33, 17, 8], [3, 3, 41, 7, 7, 12, 60, 1, 4]]
BLOCK = 4


@pytest.fixture(scope="module")
def verifier():
    return tiny_qwen3(VOCAB, hidden_size=32, num_layers=3, seed=0)


def hidden_of(verifier, tokens):
    with torch.inference_mode():
        return verifier(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states


def teacher_forced(model, verifier, tokens, drafts):
    """Training's view of one block anchored at the last token of `tokens`, with `drafts` as the tokens the
    verifier produced after it: Markov-biased logits (L−1, V) and confidence logits (L−1,)."""
    sequence = tokens + drafts
    ids = torch.tensor([sequence])
    anchor = torch.tensor([[len(tokens) - 1]])
    block_ids, _, _ = block_targets(ids, torch.tensor([len(sequence)]), anchor, torch.ones_like(anchor, dtype=torch.bool),
                                    BLOCK)
    embed, head, _, _ = verifier_parts(verifier)
    with torch.no_grad():
        features = model.fuse_target_hidden(hidden_of(verifier, sequence))
        logits, hidden = model(features, torch.ones_like(ids, dtype=torch.bool), block_ids, anchor, embed, head,
                               return_hidden=True)
        prev = block_ids[..., :-1]
        confidence = model.confidence_logits(hidden, prev)[0, 0] if model.confidence_head is not None else None
        biased = model.markov_logits(logits, prev) if model.markov_head is not None else logits
        return biased[0, 0], confidence


def proposer_after(model, verifier, tokens, threshold=0.0):
    proposer = BlockProposer(BlockDrafter(model, verifier), threshold)
    proposer.observe(hidden_of(verifier, tokens[:-1]), 0, len(tokens) - 1)
    return proposer


@pytest.mark.parametrize("temperature", [0.0, 1.3])
@pytest.mark.parametrize("route", ["bias table", "markov head"])
def test_drafting_chains_the_markov_head_exactly_as_training_teacher_forces_it(verifier, temperature, route,
                                                                              monkeypatch):
    """Drafts through the proposer, then the same block through the training forward with those drafts as the
    verifier's tokens: every position's biased distribution (q at T > 0, the argmax at T = 0) agrees, whether
    the proposer reads the precomputed bias table (small vocabularies) or runs the head per token (large ones)."""
    if route == "markov head":
        monkeypatch.setattr(decoding, "MARKOV_TABLE_MAX_ENTRIES", 0)
    model = block_model(verifier, BLOCK, seed=3, markov_rank=6)
    sampling = SamplingConfig(temperature=temperature)
    generator = torch.Generator().manual_seed(1)
    for tokens in PROMPTS:
        proposer = proposer_after(model, verifier, tokens)
        assert (proposer.markov_table is None) == (route == "markov head")
        drafts, q = proposer.propose(tokens, BLOCK - 1, sampling, generator)
        biased, _ = teacher_forced(model, verifier, tokens, drafts)
        if temperature == 0:
            assert q is None and drafts == biased.argmax(-1).tolist()
        else:
            torch.testing.assert_close(q, (biased / temperature).softmax(-1), atol=1e-5, rtol=1e-4)


def test_the_bias_at_position_k_reads_only_the_token_at_k_minus_1(verifier):
    model = block_model(verifier, BLOCK, seed=3, markov_rank=6)
    tokens, drafts = PROMPTS[0], [11, 12, 13]
    base, _ = teacher_forced(model, verifier, tokens, drafts)
    for changed in range(len(drafts)):
        other = list(drafts)
        other[changed] = (other[changed] + 7) % VOCAB
        moved = (teacher_forced(model, verifier, tokens, other)[0] - base).abs().amax(-1)
        for position in range(BLOCK - 1):  # position p (drafting token p + 1) reads token p: the anchor, then drafts
            assert (moved[position] > 1e-3) == (position == changed + 1), (changed, moved)
    plain = block_model(verifier, BLOCK, seed=3)
    assert (teacher_forced(plain, verifier, tokens, drafts)[0] - teacher_forced(plain, verifier, tokens, [1, 2, 3])[0]
            ).abs().max() == 0  # without the head the masked block tokens are invisible


def test_a_fresh_markov_head_adds_nothing(verifier):
    """The projection starts at zero: training starts from DFlash drafting (same backbone weights)."""
    cfg = BlockDrafterConfig(block_size=BLOCK, num_layers=1, target_layer_ids=[0, 2])
    from pipeline.drafters.block.model import drafter_config

    plain = DFlashDraftModel(drafter_config(verifier, cfg, 1)).eval()
    dspark = DFlashDraftModel(drafter_config(verifier, cfg.model_copy(update={"markov_rank": 8}), 1)).eval()
    missing = dspark.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight"]
    assert dspark.markov_head.markov_w2.weight.abs().max() == 0 and dspark.markov_head.markov_w1.weight.std() > 0
    tokens = PROMPTS[1]
    assert torch.equal(teacher_forced(dspark, verifier, tokens, [4, 5, 6])[0],
                       teacher_forced(plain, verifier, tokens, [4, 5, 6])[0])


def test_training_reaches_the_markov_head_and_the_confidence_head_learns_acceptance_only(verifier):
    """One batch through block_signals: the Markov weights get gradients from the drafting loss; the
    confidence term (BCE against Σ min(p, q)) reaches its head and the Markov embedding, never the
    drafter's layers, so calibrating it cannot make drafting worse."""
    cfg = DSparkDrafterConfig(block_size=BLOCK, num_layers=1, target_layer_ids=[0, 2], markov_rank=6,
                             confidence_head=True, anchors_per_sequence="all")
    from pipeline.drafters.block.model import drafter_config

    torch.manual_seed(5)
    model = DFlashDraftModel(drafter_config(verifier, cfg, 1)).train()
    with torch.no_grad():
        model.markov_head.markov_w2.weight.normal_(0.0, 0.5)
    rows = [(list(range(3, 20)), 5), (PROMPTS[1] + [8, 9, 10, 11], 4)]
    batch = collate_rows(rows, pad_id=0)
    with torch.no_grad():
        out = verifier(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    targets = VerifierTargets(out.hidden_states, out.logits.argmax(-1), out.logits)
    embed, head, _, _ = verifier_parts(verifier)
    loss, terms, _, _ = block_signals(model, targets, batch, cfg, position_weights(BLOCK), torch.Generator(), embed,
                                      head)
    assert set(terms) == {"ce", "fkl", "confidence"} and 0 < float(terms["confidence"].detach()) < 10  # the defaults
    terms["confidence"].backward(retain_graph=True)
    assert model.confidence_head.proj.weight.grad.abs().sum() > 0
    assert model.markov_head.markov_w1.weight.grad.abs().sum() > 0
    assert all(p.grad is None or p.grad.abs().sum() == 0 for n, p in model.named_parameters()
               if not n.startswith(("confidence_head.", "markov_head.markov_w1")))
    model.zero_grad()
    terms["fkl"].backward()
    assert model.markov_head.markov_w2.weight.grad.abs().sum() > 0 and model.fc.weight.grad.abs().sum() > 0
    same = torch.randn(2, 7)
    torch.testing.assert_close(acceptance_rate(same, same), torch.ones(2))
    assert float(acceptance_rate(torch.tensor([[9.0, 0.0]]), torch.tensor([[0.0, 9.0]]))) < 0.01


@pytest.mark.parametrize("threshold, expected", [(0.0, 3), (0.3, 2), (0.59, 1), (0.7, 0)])
def test_the_confidence_head_cuts_the_block_where_the_running_acceptance_falls_below_the_threshold(
        verifier, threshold, expected):
    model = block_model(verifier, BLOCK, seed=3, markov_rank=6, confidence=True)
    with torch.no_grad():  # every position: predicted acceptance 0.6, so the block reaches 0.6, 0.36, 0.216
        model.confidence_head.proj.weight.zero_()
        model.confidence_head.proj.bias.fill_(math.log(0.6 / 0.4))
    tokens = PROMPTS[0]
    drafts, _ = proposer_after(model, verifier, tokens, threshold).propose(tokens, BLOCK - 1, SamplingConfig(), None)
    full, _ = proposer_after(model, verifier, tokens).propose(tokens, BLOCK - 1, SamplingConfig(), None)
    assert drafts == full[:expected]
    _, confidence = teacher_forced(model, verifier, tokens, full)
    torch.testing.assert_close(confidence.sigmoid(), torch.full((BLOCK - 1,), 0.6))


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_dspark_greedy_output_equals_the_verifiers(verifier, threshold):
    model = block_model(verifier, BLOCK, seed=3, markov_rank=6, confidence=True)
    with torch.no_grad():
        model.confidence_head.proj.weight.normal_(0.0, 1.0)
    drafter = BlockDrafter(model, verifier)
    for prompt in PROMPTS:
        got = decode(verifier, prompt, 11, proposer=BlockProposer(drafter, threshold))
        assert got.new_ids == baseline(verifier, prompt, 11)
        assert all(step.drafted <= BLOCK - 1 for step in got.steps)


def test_dspark_heads_belong_to_the_dspark_kind_and_a_dspark_block_is_not_denoised(verifier):
    for heads in ({"confidence_head": True}, {"markov_rank": 16}):
        with pytest.raises(ParamsError, match="train.block: markov_rank / confidence_head are the DSpark kind's: "
                                              "set them under train.dspark") as caught:
            parse_all({"train": {"block": heads}})
        assert "\n" not in str(caught.value)
    with pytest.raises(ParamsError, match="train.dspark.markov_rank"):
        parse_all({"train": {"dspark": {"markov_rank": 0}}})
    params = parse_all({"train": {"dspark": {"markov_rank": 16}}, "evaluate": {"confidence_threshold": 0.2}})
    loss = params.train.dspark.loss
    assert params.train.dspark.confidence_head and (loss.ce, loss.fkl, loss.greedy_chain) == (0.1, 1.0, False)
    assert params.train.block.markov_rank == 0 and params.train.block.loss.greedy_chain
    assert params.train.dspark.trainer.learning_rate == 6e-3 and params.train.block.trainer.learning_rate == 2e-3
    # a partial loss or trainer section keeps DSpark's defaults for what it does not name, not the block kind's
    partial = parse_all({"train": {"dspark": {"loss": {"temperature": 0.8}, "trainer": {"max_steps": 7}}}}).train.dspark
    assert (partial.loss.ce, partial.loss.greedy_chain, partial.loss.temperature) == (0.1, False, 0.8)
    assert (partial.trainer.learning_rate, partial.trainer.max_steps, partial.trainer.optimizer) == (6e-3, 7, "muon")
    with pytest.raises(DraftlineError, match="evaluate.denoise_steps: 1"):
        BlockDrafter(block_model(verifier, BLOCK, markov_rank=4), verifier, denoise_steps=2)
