"""Corpus rows -> right-padded (prompt + response) batches that keep each row's prompt length and each
batch's index: the kinds that draft from the verifier's hidden states pick their own training positions
in them (the block drafter's anchors) and key cached verifier outputs by batch.
"""

from __future__ import annotations

from typing import Sequence

import torch
from datasets import Dataset
from torch import Tensor

from pipeline.errors import DraftlineError
from pipeline.training.corpus_data import CorpusDataModule, bucketed_batches, row_sequence


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


class PromptResponseBatches(torch.utils.data.Dataset):
    """Item i is the collated, length-bucketed batch i (DataLoader runs with batch_size=None)."""

    def __init__(self, split: Dataset, max_len: int, batch_size: int, pad_id: int, seed: int):
        self.rows = [
            row_sequence(prompt, response, max_len)
            for prompt, response in zip(split["prompt_ids"], split["response_ids"])
            if len(response) >= 2
        ]
        if not self.rows:
            raise DraftlineError("no corpus rows with >= 2 response tokens; rebuild the corpus with longer responses")
        self.batches = bucketed_batches([len(tokens) for tokens, _ in self.rows], batch_size, seed)
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        batch = collate_rows([self.rows[i] for i in self.batches[index]], self.pad_id)
        batch["batch_index"] = torch.tensor(index)
        return batch

    def response_tokens(self) -> int:
        return sum(len(tokens) - prompt_len for tokens, prompt_len in self.rows)


class PromptResponseDataModule(CorpusDataModule):
    batches_type = PromptResponseBatches
