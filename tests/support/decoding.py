"""Tiny drafters for the decoding loop, and the verifier's own output it must reproduce."""

import torch

from pipeline.drafters.block.model import DFlashConfig, DFlashDraftModel
from pipeline.drafters.speculative_loop import decode

VOCAB = 96  # the vocabulary of the decoding-loop tests' tiny verifiers


def block_model(verifier, block_size: int, seed: int = 0, markov_rank: int = 0,
                confidence: bool = False) -> DFlashDraftModel:
    """A random DFlash drafter reading the verifier's first and last layers; with `markov_rank` the DSpark
    variant, whose Markov head is made strong enough to change the drafts (a fresh one adds nothing)."""
    torch.manual_seed(seed)
    config = DFlashConfig(
        block_size=block_size, num_target_layers=verifier.config.num_hidden_layers, num_hidden_layers=1,
        hidden_size=verifier.config.hidden_size, num_attention_heads=4, num_key_value_heads=2,
        head_dim=verifier.config.hidden_size // 4, intermediate_size=2 * verifier.config.hidden_size,
        rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=verifier.config.vocab_size,
        dflash_config={"mask_token_id": 1, "target_layer_ids": [0, verifier.config.num_hidden_layers - 1]},
        markov_rank=markov_rank, enable_confidence_head=confidence,
    )
    model = DFlashDraftModel(config).eval()
    if markov_rank:
        with torch.no_grad():
            model.markov_head.markov_w1.weight.normal_(0.0, 1.0)
            model.markov_head.markov_w2.weight.normal_(0.0, 2.0)
    return model


def baseline(verifier, prompt, max_new, eos=None):
    return decode(verifier, prompt, max_new, eos_token_id=eos).new_ids
