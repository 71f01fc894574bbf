"""Tiny verifier/drafter factories shared by the tests (no downloads: everything is built here)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

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


def save_tiny_verifier(directory: Path, *, seed: int = 0, num_layers: int = 4, hidden_size: int = 32):
    """A random tiny verifier saved as a standard HF checkpoint dir (model + tokenizer). vLLM's CPU attention
    needs `hidden_size` 128 (head_dim 32; it rejects 8)."""
    tokenizer = tiny_tokenizer()
    model = tiny_qwen3(len(tokenizer), hidden_size=hidden_size, num_layers=num_layers, seed=seed,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model, tokenizer


LLAMA_SPECIALS = ["<s>", "</s>", "<|eot|>"]  # bos, eos, an end-of-turn id that is not the tokenizer's eos


def tiny_llama_tokenizer(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """Llama-style: adds BOS to every encoding, and has no mask, pad, unk or reserved token to spare."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=LLAMA_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(TOKENIZER_TEXTS * 4, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   add_bos_token=True, padding_side="left")
    fast.model_max_length = 1 << 20
    return fast


def tiny_llama(tokenizer: PreTrainedTokenizerFast, *, hidden_size: int = 32, num_layers: int = 5,
               seed: int = 0) -> LlamaForCausalLM:
    """Its generation_config ends text at the tokenizer's eos or at `<|eot|>`, as chat checkpoints do."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
        max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|eot|>")],
    )
    return model


def save_tiny_eagle3(verifier, tokenizer, directory: Path, *, draft_tokens: int = 3, draft_vocab_size: int | None = None,
                     aux_layer_ids: list[int] | None = None, seed: int = 3, fit_prompts: list[list[int]] = (),
                     fit_steps: int = 60):
    """An EAGLE-3 head for `verifier` saved as train_eagle3 saves it (+ training.json); with `fit_prompts`,
    first fitted to the verifier's greedy continuations of them, so that its drafts are accepted often
    on those prompts and acceptance checks are not vacuous."""
    import json

    from pipeline.drafters.eagle3.config import Eagle3DrafterConfig
    from pipeline.drafters.eagle3.model import build_drafter

    cfg = Eagle3DrafterConfig(draft_vocab_size=draft_vocab_size, aux_layer_ids=aux_layer_ids,
                              loss={"ce": 1.0, "fkl": 0.0})
    vocab = verifier.config.vocab_size
    head = build_drafter(verifier, cfg, [list(range(0, vocab, 3))], seed=seed)
    if fit_prompts:
        fit_eagle3(head, verifier, cfg, fit_prompts, fit_steps)
    head.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "training.json").write_text(json.dumps({"kind": "eagle3", "draft_tokens": draft_tokens,
                                                         "lineage": {"verifier_id": "tiny"}}))
    return head


def fit_eagle3(head, verifier, cfg, prompts: list[list[int]], steps: int, new_tokens: int = 48) -> None:
    """Adam on the real training loss over the verifier's greedy continuations of `prompts`."""
    from pipeline.drafters.eagle3.lightning import ttt_signals, verifier_targets
    from pipeline.training.frozen import FrozenVerifier
    from pipeline.training.prompt_response_data import collate_rows

    rows = []
    with torch.no_grad():
        for prompt in prompts:
            out = verifier.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                    max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
            rows.append((out[0].tolist(), len(prompt)))
    batch = collate_rows(rows, pad_id=0)
    targets = verifier_targets(FrozenVerifier(verifier), batch, head, cfg)
    optimizer = torch.optim.Adam(head.parameters(), lr=3e-3)
    head.train()
    for _ in range(steps):
        loss, _, _, _ = ttt_signals(head, targets, batch, cfg, verifier.get_input_embeddings(), prompt_positions=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    head.eval()


def fit_block(verifier, mask_token_id: int, prompts: list[list[int]], steps: int, *, block_size: int = 4,
              markov_rank: int = 0, target_layer_ids: tuple[int, ...] = (0, 2), new_tokens: int = 48):
    """A block drafter for `verifier` (the DSpark variant with `markov_rank`), fitted by Adam on the real training
    signal over the verifier's greedy continuations of `prompts`: its drafts are accepted often on them."""
    from pipeline.drafters.block.config import BlockDrafterConfig
    from pipeline.drafters.block.lightning import anchor_generator, block_signals, verifier_targets
    from pipeline.drafters.block.losses import position_weights
    from pipeline.drafters.block.model import DFlashDraftModel, drafter_config, verifier_parts
    from pipeline.drafters.dspark.config import DSparkDrafterConfig
    from pipeline.training.frozen import FrozenVerifier
    from pipeline.training.prompt_response_data import collate_rows

    shape = dict(block_size=block_size, num_layers=1, target_layer_ids=list(target_layer_ids))
    cfg = (DSparkDrafterConfig(**shape, markov_rank=markov_rank, confidence_head=False) if markov_rank
           else BlockDrafterConfig(**shape))
    torch.manual_seed(0)
    drafter = DFlashDraftModel(drafter_config(verifier, cfg, mask_token_id))
    rows = []
    with torch.no_grad():
        for prompt in prompts:
            out = verifier.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                    max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)
            rows.append((out[0].tolist(), len(prompt)))
    batch = collate_rows(rows, pad_id=0)
    targets = verifier_targets(FrozenVerifier(verifier), batch, drafter, cfg)
    embed_tokens, lm_head, _, _ = verifier_parts(verifier)
    weights = position_weights(block_size, cfg.gamma)
    optimizer = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    drafter.train()
    for step in range(steps):
        loss, _, _, _ = block_signals(drafter, targets, batch, cfg, weights, anchor_generator(0, step, 0, 0),
                                      embed_tokens, lm_head, prompt_anchors=True)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return drafter.eval()
