"""Corpus rows -> right-padded (prompt + response) batches that keep each row's prompt length and each
batch's index: the kinds that draft from the verifier's hidden states pick their own training positions
in them (the block drafter's anchors) and key cached verifier outputs by batch.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from pipeline.training.corpus_data import Batches, CorpusDataModule


def collate_rows(rows: Sequence[tuple[list[int], int]], pad_id: int) -> dict[str, Tensor]:
    """input_ids/attention_mask (B, T) right-padded, plus prompt_lens and lengths (B,)."""
    width = max(len(tokens) for tokens, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (tokens, _) in enumerate(rows):
        input_ids[i, : len(tokens)] = torch.tensor(tokens)
        attention_mask[i, : len(tokens)] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "prompt_lens": torch.tensor([prompt_len for _, prompt_len in rows], dtype=torch.long),
        "lengths": torch.tensor([len(tokens) for tokens, _ in rows], dtype=torch.long),
    }


class PromptResponseBatches(Batches):
    min_response = 2
    collate_rows = staticmethod(collate_rows)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        batch = super().__getitem__(index)
        batch["batch_index"] = torch.tensor(index)
        return batch


class PromptResponseDataModule(CorpusDataModule):
    batches_type = PromptResponseBatches
