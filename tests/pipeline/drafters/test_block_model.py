"""The DFlash block drafter: no leakage across blocks or from the future, the batched training forward
and loss against block-by-block cached inference, decay weights, layer selection, and the saved layout."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from pipeline.drafters.block.anchors import block_targets
from pipeline.drafters.block.config import BlockDrafterConfig, BlockLossConfig, build_target_layer_ids
from pipeline.drafters.block.losses import block_loss, default_gamma, dpace_weights, position_weights
from pipeline.drafters.block.model import DFlashDraftModel, drafter_config, verifier_parts
from tests.support.tiny_models import tiny_qwen3

CE = BlockLossConfig(ce=1.0, fkl=0.0, position_weights="exponential")  # the fixed weights the reference sums

VOCAB, MASK_ID, BLOCK = 320, 1, 4


@pytest.fixture(scope="module")
def verifier():
    return tiny_qwen3(VOCAB, num_layers=4, seed=0)


def make_drafter(verifier, mask_token_id=MASK_ID, **overrides) -> DFlashDraftModel:
    cfg = BlockDrafterConfig(block_size=BLOCK, num_layers=2, target_layer_ids=[1, 2], **overrides)
    torch.manual_seed(1)
    drafter = DFlashDraftModel(drafter_config(verifier, cfg, mask_token_id)).eval()
    # Larger-than-init weights so that any leak shows up far above float noise.
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.normal_(0.0, 0.3)
    return drafter


@pytest.fixture(scope="module")
def drafter(verifier):
    return make_drafter(verifier)


def features_of(drafter, verifier, input_ids, attention_mask=None):
    with torch.no_grad():
        out = verifier(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    return drafter.fuse_target_hidden(out.hidden_states)


def training_logits(drafter, verifier, input_ids, block_ids, anchors, attention_mask=None):
    embed, head, _, _ = verifier_parts(verifier)
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    with torch.no_grad():
        return drafter(features_of(drafter, verifier, input_ids, attention_mask), valid, block_ids, anchors, embed, head)


def blocks_for(input_ids, anchors):
    lengths = torch.full((input_ids.shape[0],), input_ids.shape[1])
    block_ids, labels, valid = block_targets(input_ids, lengths, anchors, torch.ones_like(anchors, dtype=torch.bool), BLOCK)
    return block_ids, labels, valid


def test_no_leakage_from_the_future_or_other_blocks(drafter, verifier):
    torch.manual_seed(0)
    input_ids = torch.randint(3, VOCAB, (1, 16))
    anchors = torch.tensor([[3, 7, 10]])  # blocks 7..10 and 10..13 overlap: gating must use positions
    block_ids, _, _ = blocks_for(input_ids, anchors)
    base = training_logits(drafter, verifier, input_ids, block_ids, anchors)
    length = input_ids.shape[1]
    for j, anchor in enumerate(anchors[0].tolist()):
        # Row p of the batch changes the token at position p (all positions at once, one forward).
        changed = input_ids.repeat(length, 1)
        rows = torch.arange(length)
        changed[rows, rows] = (changed[rows, rows] + 17) % (VOCAB - 3) + 3
        changed_blocks, _, _ = blocks_for(changed, anchors.repeat(length, 1))
        changed_blocks[:, j] = block_ids[0, j]  # block j itself stays as it was
        logits = training_logits(drafter, verifier, changed, changed_blocks, anchors.repeat(length, 1))[:, j]
        difference = (logits - base[0, j]).abs().flatten(1).amax(1)
        assert (difference[anchor:] < 1e-5).all(), difference  # at or after the anchor: invisible
        assert (difference[:anchor] > 1e-3).all(), difference  # before the anchor: the context it must see
        for other in range(anchors.shape[1]):
            if other == j:
                continue
            changed_blocks = block_ids.clone()
            changed_blocks[0, other] = torch.randint(3, VOCAB, (BLOCK,))
            logits = training_logits(drafter, verifier, input_ids, changed_blocks, anchors)[0, j]
            torch.testing.assert_close(logits, base[0, j], rtol=0, atol=1e-5)
        own = block_ids.clone()
        own[0, j, 0] = (own[0, j, 0] + 5) % (VOCAB - 3) + 3
        assert (training_logits(drafter, verifier, input_ids, own, anchors)[0, j] - base[0, j]).abs().max() > 1e-3


def test_causal_block_attention_sees_no_later_block_position(verifier, tmp_path):
    """train.block.attention: causal: position i of a block is unchanged by any later block token, and the
    choice is saved as dflash_config.causal (what vLLM reads); bidirectional blocks see the whole block."""
    torch.manual_seed(0)
    input_ids = torch.randint(3, VOCAB, (1, 12))
    anchors = torch.tensor([[4, 7]])
    block_ids, _, _ = blocks_for(input_ids, anchors)
    masked = (torch.arange(BLOCK) > 0).expand_as(block_ids).clone()
    masked[0, 0, 2] = False  # block 0 position 2 holds a real token (as after an unmasking step)
    changed = block_ids.clone()
    changed[0, 0, 2] = (changed[0, 0, 2] + 5) % (VOCAB - 3) + 3
    embed, head, _, _ = verifier_parts(verifier)
    positions = torch.arange(input_ids.shape[1])[None]
    for attention, later_visible in (("causal", False), ("bidirectional", True)):
        drafter = make_drafter(verifier, attention=attention)
        assert drafter.config.causal is (attention == "causal")
        context = drafter.context_key_values(features_of(drafter, verifier, input_ids), positions)
        with torch.no_grad():
            base, logits = (drafter.block_logits(context, positions, None, ids, masked, anchors, embed, head)[0, 0]
                            for ids in (block_ids, changed))
        difference = (logits - base).abs().flatten(1).amax(1)  # rows: block positions 1..3
        assert difference[0] > 1e-3 if later_visible else difference[0] < 1e-5, difference
        assert (difference[1:] > 1e-3).all(), difference  # position 2 itself and after it see the change
    drafter.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dflash_config"]["causal"] is False
    make_drafter(verifier, attention="causal").save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dflash_config"]["causal"] is True


def test_decay_weights():
    assert default_gamma(16) == 7 and default_gamma(10) == 5 and default_gamma(8) == 4
    assert 4 < default_gamma(9) < 5 and 5 < default_gamma(12) < 7 and default_gamma(2) >= 1
    weights = position_weights(16)
    assert weights.shape == (15,)
    torch.testing.assert_close(weights.sum(), torch.tensor(1.0))
    torch.testing.assert_close(weights[1:] / weights[:-1], torch.full((14,), torch.exp(torch.tensor(-1 / 7)).item()))
    raw = torch.exp(-torch.arange(7, dtype=torch.float32) / 4)
    torch.testing.assert_close(position_weights(8), raw / raw.sum())


def test_dpace_weights_follow_the_blocks_expected_acceptance():
    """w_k = Σ_{j≥k} Π_{i≤j} q_i with q smoothed by alpha: a sure prefix keeps later positions heavy, a
    position behind an unlikely one weighs little, invalid positions weigh nothing."""
    nll = torch.tensor([[0.0, 0.0, 0.0], [20.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # q = 1 1 1 / ~0 1 1 / 1 1 1
    valid = torch.tensor([[True, True, True], [True, True, True], [True, True, False]])
    expected = torch.tensor([[3.0, 2.0, 1.0], [1.5, 1.0, 0.5], [2.0, 1.0, 0.0]])
    torch.testing.assert_close(dpace_weights(nll, valid, alpha=0.5), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(dpace_weights(nll[1:2], valid[1:2], alpha=1.0), torch.tensor([[3.0, 2.0, 1.0]]))


def test_dpace_loss_weights_blocks_by_confidence():
    """The same logits weigh their positions differently under dpace than under the fixed decay, for ce and
    for fkl alone (whose D-PACE confidences come from the labels all the same)."""
    torch.manual_seed(0)
    logits, labels, teacher = torch.randn(2, 5, 3, 10), torch.randint(0, 10, (2, 5, 3)), torch.randn(2, 5, 3, 10)
    valid = torch.ones_like(labels, dtype=torch.bool)
    for loss in (dict(ce=1.0, fkl=0.0), dict(ce=0.0, fkl=1.0)):
        fixed, dpace = (block_loss(BlockLossConfig(**loss, position_weights=weights), logits, valid, position_weights(4),
                                   labels=labels, teacher_logits=teacher)[0] for weights in ("exponential", "dpace"))
        assert abs(fixed.item() - dpace.item()) > 1e-4, loss


def test_target_layer_selection():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # z-lab Qwen3-8B-DFlash-b16
    assert build_target_layer_ids(8, 5) == [1, 2, 3, 4, 5]
    assert build_target_layer_ids(4, 5) == [2]  # shallow verifier: fewer layers
    assert build_target_layer_ids(12, 1) == [6]


def reference_block(drafter, verifier, features_row, anchor_id, anchor, chunks=(0.5,)):
    """One block alone through the serving path: context extended in chunks, then draft_block."""
    embed, head, _, _ = verifier_parts(verifier)
    cache = drafter.new_context_cache()
    cuts = [0, *[max(1, int(anchor * c)) for c in chunks], anchor]
    for start, stop in zip(cuts[:-1], cuts[1:]):
        if stop > start:
            drafter.extend_context(cache, features_row[None, start:stop], torch.arange(start, stop)[None])
    return drafter.draft_block(cache, torch.tensor([anchor_id]), torch.tensor([anchor]), embed, head)


def test_batched_loss_equals_block_by_block_reference(drafter, verifier):
    torch.manual_seed(2)
    input_ids = torch.randint(3, VOCAB, (2, 14))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 11:] = 0  # row 1 is shorter (right padding)
    lengths = attention_mask.sum(1)
    anchors = torch.tensor([[2, 5, 12], [4, 9, 0]])
    anchor_valid = torch.tensor([[True, True, True], [True, True, False]])
    block_ids, labels, label_valid = block_targets(input_ids, lengths, anchors, anchor_valid, BLOCK)
    assert not label_valid[0, 2, 1:].any() and not label_valid[1, 2].any()  # past the end / no anchor
    logits = training_logits(drafter, verifier, input_ids, block_ids, anchors, attention_mask)
    weights = position_weights(BLOCK)
    batched, _ = block_loss(CE, logits, label_valid, weights, labels=labels)

    features = features_of(drafter, verifier, input_ids, attention_mask)
    numerator = denominator = 0.0
    for b in range(2):
        for n in range(3):
            if not anchor_valid[b, n]:
                continue
            anchor = int(anchors[b, n])
            _, ref_logits = reference_block(drafter, verifier, features[b], int(input_ids[b, anchor]), anchor)
            torch.testing.assert_close(logits[b, n], ref_logits[0], rtol=1e-4, atol=1e-4)
            for k in range(BLOCK - 1):
                if label_valid[b, n, k]:
                    nll = torch.nn.functional.cross_entropy(ref_logits[0, k], labels[b, n, k])
                    numerator += weights[k] * nll
                    denominator += weights[k]
    torch.testing.assert_close(batched, numerator / denominator, rtol=1e-5, atol=1e-5)


def test_cache_crop_and_position_gating(drafter, verifier):
    torch.manual_seed(3)
    input_ids = torch.randint(3, VOCAB, (1, 12))
    features = features_of(drafter, verifier, input_ids)[0]
    anchor = 6
    _, expected = reference_block(drafter, verifier, features, int(input_ids[0, anchor]), anchor, chunks=(0.3, 0.6))
    embed, head, _, _ = verifier_parts(verifier)
    # A cache holding the whole sequence: positions >= the anchor are gated out...
    cache = drafter.new_context_cache()
    drafter.extend_context(cache, features[None], torch.arange(12)[None])
    _, gated = drafter.draft_block(cache, input_ids[:, anchor], torch.tensor([anchor]), embed, head)
    torch.testing.assert_close(gated, expected, rtol=1e-4, atol=1e-4)
    # ...and cropping to the committed prefix gives the same draft.
    drafter.crop_context(cache, anchor)
    assert cache.length == anchor
    _, cropped = drafter.draft_block(cache, input_ids[:, anchor], torch.tensor([anchor]), embed, head)
    torch.testing.assert_close(cropped, expected, rtol=1e-4, atol=1e-4)


def test_iterative_unmasking(drafter, verifier):
    torch.manual_seed(4)
    input_ids = torch.randint(3, VOCAB, (1, 10))
    features = features_of(drafter, verifier, input_ids)[0]
    embed, head, _, _ = verifier_parts(verifier)
    cache = drafter.new_context_cache()
    drafter.extend_context(cache, features[None, :5], torch.arange(5)[None])
    one_ids, one_logits = drafter.draft_block(cache, input_ids[:, 5], torch.tensor([5]), embed, head, denoise_steps=1)
    ids, logits = drafter.draft_block(cache, input_ids[:, 5], torch.tensor([5]), embed, head, denoise_steps=BLOCK - 1)
    assert ids.shape == (1, BLOCK - 1) and logits.shape == (1, BLOCK - 1, VOCAB)
    torch.testing.assert_close(one_ids, one_logits.argmax(-1))
    first = one_logits.softmax(-1).amax(-1).argmax(-1)  # the most confident position is committed first
    assert ids[0, first] == one_ids[0, first]
    torch.testing.assert_close(logits[0, first], one_logits[0, first])
    assert not torch.allclose(logits, one_logits)  # later positions were re-run with committed tokens


def test_save_load_layout(drafter, verifier, tmp_path):
    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "dflash"
    assert config["block_size"] == BLOCK and config["num_target_layers"] == 4
    assert config["dflash_config"]["mask_token_id"] == MASK_ID
    assert config["dflash_config"]["target_layer_ids"] == [1, 2]
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "rms_norm_eps", "rope_theta", "num_hidden_layers", "vocab_size"):
        assert key in config, key
    assert config["hidden_size"] == verifier.config.hidden_size and config["vocab_size"] == VOCAB
    with safe_open(tmp_path / "model.safetensors", "pt") as handle:
        names = set(handle.keys())
    layer = {f"layers.{i}.{name}.weight" for i in range(2) for name in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm",
        "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
        "post_attention_layernorm")}
    assert names == layer | {"fc.weight", "hidden_norm.weight", "norm.weight"}
    assert drafter.fc.weight.shape == (verifier.config.hidden_size, 2 * verifier.config.hidden_size)

    loaded = DFlashDraftModel.from_pretrained(tmp_path).eval()
    input_ids = torch.randint(3, VOCAB, (1, 9))
    anchors = torch.tensor([[3, 5]])
    block_ids, _, _ = blocks_for(input_ids, anchors)
    torch.testing.assert_close(
        training_logits(loaded, verifier, input_ids, block_ids, anchors),
        training_logits(drafter, verifier, input_ids, block_ids, anchors),
    )


def test_learned_mask_when_the_verifier_has_none(verifier, tmp_path):
    drafter = make_drafter(verifier, mask_token_id=None)
    assert drafter.config.mask_mode == "learned" and drafter.config.dflash_config["mask_token_id"] is None
    input_ids = torch.randint(3, VOCAB, (1, 10))
    anchors = torch.tensor([[4, 6]])
    block_ids, labels, valid = blocks_for(input_ids, anchors)
    embed, head, _, _ = verifier_parts(verifier)
    logits = drafter(features_of(drafter, verifier, input_ids), torch.ones_like(input_ids, dtype=torch.bool),
                     block_ids, anchors, embed, head)
    block_loss(CE, logits, valid, position_weights(BLOCK), labels=labels)[0].backward()
    assert drafter.mask_embedding.grad.abs().sum() > 0
    drafter.save_pretrained(tmp_path)
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded.mask_embedding, drafter.mask_embedding)


def test_block_positions_read_the_verifier_where_it_predicts_them(verifier):
    from pipeline.drafters.block.lightning import at_block_positions

    input_ids = torch.randint(3, VOCAB, (2, 11))
    anchors = torch.tensor([[2, 6], [0, 7]])
    with torch.no_grad():
        logits = verifier(input_ids=input_ids).logits
    top1 = at_block_positions(logits.argmax(-1), anchors, BLOCK)
    gathered = at_block_positions(logits, anchors, BLOCK)
    assert top1.shape == (2, 2, BLOCK - 1) and gathered.shape == (2, 2, BLOCK - 1, VOCAB)
    for b in range(2):
        for n in range(2):
            for k in range(1, BLOCK):  # the token at anchor + k is predicted at anchor + k - 1
                position = min(int(anchors[b, n]) + k - 1, input_ids.shape[1] - 1)
                assert top1[b, n, k - 1] == logits[b, position].argmax()
                torch.testing.assert_close(gathered[b, n, k - 1], logits[b, position])


def test_block_loss_terms_are_position_weighted():
    torch.manual_seed(4)
    student = torch.randn(2, 3, BLOCK - 1, 7)
    teacher = torch.randn(2, 3, BLOCK - 1, 7)
    labels = teacher.argmax(-1)
    valid = torch.rand(2, 3, BLOCK - 1) > 0.3
    weights = position_weights(BLOCK)
    fixed = {"position_weights": "exponential"}  # the weights this test sums by hand
    total, terms = block_loss(BlockLossConfig(ce=0.5, fkl=2.0, **fixed), student, valid, weights, labels=labels,
                              teacher_logits=teacher)
    nll = torch.nn.functional.cross_entropy(student.flatten(0, -2), labels.flatten(), reduction="none").view_as(labels)
    log_p, log_q = teacher.log_softmax(-1), student.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    w = weights * valid
    torch.testing.assert_close(terms["ce"], (nll * w).sum() / w.sum())
    torch.testing.assert_close(terms["fkl"], (kl * w).sum() / w.sum())
    torch.testing.assert_close(total, 0.5 * terms["ce"] + 2.0 * terms["fkl"])
    # a student equal to the teacher has zero KL; invalid positions never count
    _, same = block_loss(BlockLossConfig(ce=0.0, fkl=1.0, **fixed), teacher, valid, weights, teacher_logits=teacher)
    assert same["fkl"].abs() < 1e-6
    garbage = student.clone()
    garbage[~valid] = 1e4
    _, masked = block_loss(CE, garbage, valid, weights, labels=labels)
    torch.testing.assert_close(masked["ce"], terms["ce"])


def test_final_norm_starts_as_the_verifiers():
    from pipeline.drafters.block.model import build_drafter

    verifier = tiny_qwen3(VOCAB, num_layers=4, seed=1)
    with torch.no_grad():
        verifier.model.norm.weight.uniform_(0.5, 1.5)
    drafter = build_drafter(verifier, BlockDrafterConfig(block_size=BLOCK, num_layers=1), MASK_ID, seed=0)
    torch.testing.assert_close(drafter.norm.weight, verifier.model.norm.weight)


def test_greedy_chain_keeps_labels_only_behind_argmax_tokens():
    from pipeline.drafters.block.lightning import greedy_chain

    verifier_top1 = torch.tensor([[[5, 6, 7], [5, 6, 7], [5, 6, 7]]])
    corpus = torch.tensor([[[5, 6, 9], [5, 8, 7], [4, 6, 7]]])  # follows / leaves at 2 / leaves at 1
    assert greedy_chain(corpus, verifier_top1).tolist() == [[[True, True, True], [True, True, False],
                                                             [True, False, False]]]
