"""A tiny block-drafter Lightning module with a verifier that counts its forwards, and batches to feed it."""

from __future__ import annotations

import torch
from datasets import Dataset

from pipeline.config.trainer_config import TrainerConfig
from pipeline.drafters.block.config import BlockDrafterConfig
from pipeline.drafters.block.lightning import BlockDistillModule
from pipeline.drafters.block.model import DFlashDraftModel, drafter_config
from pipeline.training.frozen import FrozenVerifier
from pipeline.training.prompt_response_data import PromptResponseBatches
from tests.support.tiny_models import tiny_qwen3

VOCAB = 64


def batches() -> PromptResponseBatches:
    generator = torch.Generator().manual_seed(0)
    rows = [{"prompt_ids": torch.randint(2, VOCAB, (3 + i % 3,), generator=generator).tolist(),
             "response_ids": torch.randint(2, VOCAB, (6 + i % 4,), generator=generator).tolist()} for i in range(8)]
    return PromptResponseBatches(Dataset.from_list(rows), max_len=32, batch_size=4, pad_id=0, seed=0)


def module(**overrides) -> tuple[BlockDistillModule, list[int]]:
    verifier = tiny_qwen3(VOCAB, num_layers=4)
    cfg = BlockDrafterConfig(block_size=4, num_layers=1, target_layer_ids=[0, 2], **overrides)
    torch.manual_seed(0)
    drafter = DFlashDraftModel(drafter_config(verifier, cfg, None))
    forwards: list[int] = []
    verifier.register_forward_hook(lambda *_: forwards.append(1))
    return BlockDistillModule(drafter, FrozenVerifier(verifier), cfg, TrainerConfig(), seed=0), forwards
