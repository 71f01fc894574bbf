"""Tiny verifier/drafter factories shared by the tests (no downloads: everything is built here)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from data_prep.tokenizer import train_bpe_tokenizer

TOKENIZER_TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "class Stack:\n    def push(self, item):\n        self.items.append(item)\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Speculative decoding drafts tokens with a small model and verifies them in one pass.",
    "import os\nimport sys\nfor i in range(10):\n    print(i)\n",
]


def tiny_tokenizer(vocab_size: int = 320):
    return train_bpe_tokenizer(TOKENIZER_TEXTS * 4, vocab_size)


def tiny_qwen3(vocab_size: int, *, hidden_size: int = 32, num_layers: int = 4, seed: int = 0,
               eos_token_id: int | None = None, pad_token_id: int | None = None) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    model = Qwen3ForCausalLM(config).eval()
    return model


def save_tiny_verifier(directory: Path, *, seed: int = 0, num_layers: int = 4):
    """A random tiny verifier saved as a standard HF checkpoint dir (model + tokenizer)."""
    tokenizer = tiny_tokenizer()
    model = tiny_qwen3(len(tokenizer), num_layers=num_layers, seed=seed,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer


def save_tiny_eagle3(verifier, tokenizer, directory: Path, *, draft_tokens: int = 3, draft_vocab_size: int | None = None,
                     aux_layer_ids: list[int] | None = None, seed: int = 3):
    """An untrained EAGLE-3 head for `verifier` saved as train_eagle3 saves it (+ training.json)."""
    import json

    from pipeline.config import Eagle3DrafterConfig
    from pipeline.drafters.eagle3.model import build_drafter

    cfg = Eagle3DrafterConfig(draft_vocab_size=draft_vocab_size, aux_layer_ids=aux_layer_ids)
    vocab = verifier.config.vocab_size
    head = build_drafter(verifier, cfg, [list(range(0, vocab, 3))], seed=seed)
    head.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "training.json").write_text(json.dumps({"kind": "eagle3", "draft_tokens": draft_tokens,
                                                         "lineage": {"verifier_id": "tiny"}}))
    return head
