"""Corpus rows -> (prompt + response) token sequences in length buckets, with a response mask.

Each dataset item is a whole pre-bucketed batch (sequences of similar length, padded on the right to
the batch max), so little compute is spent on padding, and `ResumableShuffle` deals whole batches out
to the processes. The loss/agreement mask marks *prediction* positions t whose target
token t+1 is a response token: prompt and padding never count.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

import torch
from datasets import Dataset, DatasetDict
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, DistributedSampler

from pipeline.errors import DraftlineError
from pipeline.training.feature_batches import SplitFeatures, TrainingFeatures


def row_sequence(prompt_ids: Sequence[int], response_ids: Sequence[int], max_len: int) -> tuple[list[int], int]:
    """(tokens, prompt length) truncated to `max_len`: the prompt loses its start first, then the response its end."""
    keep_prompt = max(1, min(len(prompt_ids), max_len - len(response_ids)))
    prompt = list(prompt_ids[-keep_prompt:])
    tokens = (prompt + list(response_ids))[:max_len]
    return tokens, len(prompt)


def collate(rows: list[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(tokens) for tokens, _ in rows)
    batch = len(rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    response_mask = torch.zeros((batch, width), dtype=torch.bool)
    for i, (tokens, prompt_len) in enumerate(rows):
        input_ids[i, : len(tokens)] = torch.tensor(tokens)
        attention_mask[i, : len(tokens)] = 1
        # prediction position t predicts token t+1; the first response token is predicted at prompt_len-1
        response_mask[i, prompt_len - 1 : len(tokens) - 1] = True
    labels = torch.cat([input_ids[:, 1:], torch.full((batch, 1), pad_id, dtype=torch.long)], dim=1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "loss_mask": response_mask}


def kept_rows(split: Dataset, max_len: int, min_response: int) -> tuple[list[int], list[tuple[list[int], int]]]:
    """(original row indices, (tokens, prompt length)) of the rows with >= `min_response` response tokens: the
    index is what stored verifier features are looked up by."""
    kept = [(index, row_sequence(prompt, response, max_len))
            for index, (prompt, response) in enumerate(zip(split["prompt_ids"], split["response_ids"]))
            if len(response) >= min_response]
    return [index for index, _ in kept], [row for _, row in kept]


class Batches(torch.utils.data.Dataset):
    """Item i is the collated, length-bucketed batch i (so DataLoader runs with batch_size=None), with the
    rows' stored verifier features when training offline (`features`)."""

    min_response = 1
    collate_rows: Callable[[list[tuple[list[int], int]], int], dict[str, torch.Tensor]]  # (rows, pad id) -> batch

    def __init__(self, split: Dataset, max_len: int, batch_size: int, pad_id: int, seed: int,
                 features: SplitFeatures | None = None):
        self.row_ids, self.rows = kept_rows(split, max_len, self.min_response)
        if not self.rows:
            raise DraftlineError(f"no corpus rows with >= {self.min_response} response tokens; rebuild the corpus "
                                 "with longer responses")
        self.batches = bucketed_batches([len(tokens) for tokens, _ in self.rows], batch_size, seed)
        self.pad_id = pad_id
        self.features = features

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        members = self.batches[index]
        batch = self.collate_rows([self.rows[i] for i in members], self.pad_id)
        if self.features is not None:
            batch.update(self.features.batch([self.row_ids[i] for i in members], [self.rows[i][0] for i in members],
                                             batch["input_ids"].shape[1]))
        return batch

    def response_tokens(self) -> int:
        return sum(len(tokens) - prompt_len for tokens, prompt_len in self.rows)


def bucketed_batches(lengths: Sequence[int], batch_size: int, seed: int) -> list[list[int]]:
    """Index batches of similar length: random order within equal lengths, then sorted, then chunked."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    order.sort(key=lambda index: lengths[index])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


class NextTokenBatches(Batches):
    collate_rows = staticmethod(collate)


class ResumableShuffle(DistributedSampler):
    """A fresh permutation each epoch, drawn from (seed, epoch) only, dealt out to the processes as torch's
    DistributedSampler deals (padded by wrapping to a multiple of the world size; process r takes every
    world-size-th batch from r), that can start mid-epoch: a run resumed from a checkpoint sees exactly the
    batches the uninterrupted run would have seen, on one process or many.

    `consumed` counts batches over all processes (padding included), as checkpoints record them. Lightning leaves
    a DistributedSampler as it is and sets the epoch (`set_epoch`); its own wrapper for other samplers cannot
    start mid-epoch (a shorter first epoch is an IndexError on every rank).
    """

    def __init__(self, dataset, seed: int, rank: int = 0, world_size: int = 1, consumed: int = 0):
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=False, seed=seed)
        self.resume_epoch, offset = divmod(consumed, self.total_size)
        self.resume_offset = offset // world_size
        # Lightning draws the first batch before its first `set_epoch` call of a run.
        self.epoch = self.resume_epoch

    def __iter__(self):
        size = len(self.dataset)
        order = torch.randperm(size, generator=torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)).tolist()
        padding = self.total_size - size
        order += (order * -(-padding // size))[:padding]
        mine = order[self.rank : self.total_size : self.num_replicas]
        start = self.resume_offset if self.epoch == self.resume_epoch else 0
        return iter(mine[start:])


class CorpusDataModule(LightningDataModule):
    """Train/validation batches over the corpus; `batches_type` turns a split into pre-built batches."""

    batches_type: type

    def __init__(
        self, corpus: DatasetDict, *, pad_id: int, max_len: int, batch_size: int, seed: int = 0,
        num_workers: int = 0, val_split: str = "validation", features: TrainingFeatures | None = None,
    ):
        super().__init__()
        sets = []
        for split in ("train", val_split):
            if split not in corpus or len(corpus[split]) == 0:
                raise DraftlineError(f"corpus split '{split}' is empty; rebuild the corpus with more prompts")
            stored = features and features.split(split, len(corpus[split]))
            sets.append(self.batches_type(corpus[split], max_len, batch_size, pad_id, seed, stored))
        self.train_set, self.val_set = sets
        self.num_workers = num_workers
        self.seed = seed
        self.batches_consumed = 0  # from the checkpoint a run resumes

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        sampler = ResumableShuffle(self.train_set, self.seed, trainer.global_rank, trainer.world_size,
                                   self.batches_consumed)
        return DataLoader(self.train_set, batch_size=None, sampler=sampler, num_workers=self.num_workers)

    # Saved in and restored from Lightning checkpoints.
    def state_dict(self) -> dict:
        # Checkpoints are written after an optimizer step, so every batch of the finished steps was used
        # (by every process: ResumableShuffle deals the one shuffled order out round-robin).
        trainer = self.trainer
        return {"batches_consumed": trainer.global_step * trainer.accumulate_grad_batches * trainer.world_size}

    def load_state_dict(self, state: dict) -> None:
        self.batches_consumed = int(state.get("batches_consumed", 0))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=None, shuffle=False, num_workers=self.num_workers)


class NextTokenDataModule(CorpusDataModule):
    batches_type = NextTokenBatches
