"""Corpus rows -> right-padded (prompt + response) batches, and the random block anchors drawn from them.

Anchors are response positions (at serving time the anchor is always a token the verifier produced):
a in [prompt_len, length − 2], so every block has at least one label (`prompt_anchors` widens training's
range to [1, length − 2]: more blocks from a small corpus). With `anchors_per_sequence: all` every such
position anchors a block (all in one pass, as the references do for short sequences); a number draws
that many per step from a generator seeded by (seed, step, rank), which re-samples them every epoch, keeps
runs reproducible and resumable, and gives validation a fixed set (seeded by the batch index).
"""

from __future__ import annotations

from typing import Sequence

import torch
from datasets import Dataset
from torch import Tensor

from pipeline.errors import DraftlineError
from train.corpus_data import CorpusDataModule, bucketed_batches, row_sequence


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


def sample_anchors(
    first: Tensor, lengths: Tensor, per_sequence: int | str, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Anchors per row from [first, length − 2] (`first`: the prompt length, for response anchors),
    sorted: all of them (`per_sequence="all"`) or up to `per_sequence` distinct ones drawn with `generator`.

    Returns anchors (B, N) and anchor_valid (B, N); rows with fewer candidates pad with invalid
    anchors at position 0 (they carry no labels and see no context).
    """
    candidates = (lengths - 1 - first).clamp(min=0)
    if per_sequence == "all":
        width = max(1, int(candidates.max()))
        offsets = torch.arange(width)[None]
        valid = offsets < candidates[:, None]
        return torch.where(valid, first[:, None] + offsets, torch.zeros_like(offsets)), valid
    batch = first.shape[0]
    anchors = torch.zeros((batch, per_sequence), dtype=torch.long)
    valid = torch.zeros((batch, per_sequence), dtype=torch.bool)
    for row in range(batch):
        count = int(candidates[row])
        if count <= 0:
            continue
        take = min(per_sequence, count)
        picked = torch.randperm(count, generator=generator)[:take].sort().values + int(first[row])
        anchors[row, :take] = picked
        valid[row, :take] = True
    return anchors, valid


def block_targets(
    input_ids: Tensor, lengths: Tensor, anchors: Tensor, anchor_valid: Tensor, block_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Block inputs (B, N, L): the anchor token then its (masked) continuation; labels (B, N, L−1) are the
    tokens at anchor+1..anchor+L−1 with label_valid (B, N, L−1) false past the sequence end."""
    offsets = torch.arange(block_size, device=input_ids.device)
    positions = anchors[..., None] + offsets  # (B, N, L)
    in_range = positions < lengths[:, None, None]
    gathered = torch.gather(
        input_ids, 1, positions.clamp(max=input_ids.shape[1] - 1).flatten(1)
    ).view_as(positions)
    tokens = torch.where(in_range, gathered, torch.zeros_like(gathered))
    label_valid = in_range[..., 1:] & anchor_valid[..., None]
    return tokens, tokens[..., 1:], label_valid


class BlockBatches(torch.utils.data.Dataset):
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


class BlockDataModule(CorpusDataModule):
    batches_type = BlockBatches
