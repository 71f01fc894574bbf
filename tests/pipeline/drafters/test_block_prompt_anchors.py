"""`prompt_anchors`: training blocks also start inside the prompt (from position 1), labelled with the
verifier's argmax; off (and always in validation), only response positions anchor blocks."""

from __future__ import annotations

import pytest

from pipeline.drafters.block.lightning import anchor_generator, block_signals
from tests.support.block_training import batches, module


@pytest.mark.parametrize("prompt_anchors", [False, True])
def test_blocks_anchored_in_the_prompt_only_when_asked(prompt_anchors):
    trainer_module, _ = module()
    batch = batches()[0]
    targets = trainer_module.verifier_targets(batch, "train")
    _, _, _, label_valid = block_signals(trainer_module.drafter, targets, batch, trainer_module.cfg,
                                         trainer_module.weights, anchor_generator(0), trainer_module.embed_tokens,
                                         trainer_module.lm_head, prompt_anchors=prompt_anchors)
    first = 1 if prompt_anchors else batch["prompt_lens"]
    anchored = label_valid[..., 0].sum()  # every anchor has a label at position 1
    assert anchored == (batch["lengths"] - 1 - first).sum()
