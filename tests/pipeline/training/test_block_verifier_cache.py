"""The block trainer's verifier-output cache: one frozen forward per (split, batch), reused every later
visit with exactly what a fresh forward gives; off, every visit runs the verifier."""

from __future__ import annotations

import pytest
import torch

from pipeline.drafters.block.lightning import verifier_targets
from tests.support.block_training import VOCAB, batches, module


def assert_same(cached, fresh) -> None:
    assert len(cached.hidden_states) == len(fresh.hidden_states)
    for kept, again in zip(cached.hidden_states, fresh.hidden_states):
        assert (kept is None and again is None) or torch.equal(kept, again)
    assert torch.equal(cached.top1, fresh.top1)
    assert (cached.logits is None and fresh.logits is None) or torch.equal(cached.logits, fresh.logits)


def test_cache_runs_the_verifier_once_per_split_and_batch():
    trainer_module, forwards = module(cache_verifier_outputs=True)
    data = batches()
    first = trainer_module.verifier_targets(data[0], "train")
    again = trainer_module.verifier_targets(data[0], "train")
    assert len(forwards) == 1 and again is first
    trainer_module.verifier_targets(data[1], "train")
    trainer_module.verifier_targets(data[0], "validation")  # another split's batch 0 holds other rows
    assert len(forwards) == 3
    assert_same(first, verifier_targets(trainer_module.verifier, data[0], trainer_module.drafter, trainer_module.cfg))


def test_cache_keeps_only_the_target_layers_and_logits_only_for_fkl():
    trainer_module, _ = module(cache_verifier_outputs=True, loss={"ce": 1.0, "fkl": 0.0})
    targets = trainer_module.verifier_targets(batches()[0], "train")
    # index 0 is the embeddings: target layers 0 and 2 are hidden_states[1] and [3]
    assert [state is not None for state in targets.hidden_states] == [False, True, False, True, False]
    assert targets.logits is None
    with_fkl, _ = module(cache_verifier_outputs=True, loss={"ce": 1.0, "fkl": 0.5})
    assert with_fkl.verifier_targets(batches()[0], "train").logits.shape[-1] == VOCAB


@pytest.mark.parametrize("cache", [False, True])
def test_verifier_forwards_per_visit(cache):
    trainer_module, forwards = module(cache_verifier_outputs=cache)
    data = batches()
    for _ in range(3):  # three epochs over the same two batches
        for index in range(len(data)):
            trainer_module.verifier_targets(data[index], "train")
    assert len(forwards) == (len(data) if cache else 3 * len(data))
