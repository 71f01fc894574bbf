"""Offline training's data: the stored verifier features of a batch's rows, read per batch from
`artifacts/features/` (memory-mapped: a batch costs its own bytes, so RAM does not grow with the corpus).

A batch gets one right-padded (B, T, H) tensor per layer read, under `verifier_layer.<i>` (HF
`hidden_states` index i; the last layer N before the final norm, pipeline/features/store.py), in the
stored dtype (float8_e4m3 dequantised to the verifier head's dtype). Feature row r of a split is corpus row r
of that split: batches keep each row's original index, whatever rows training leaves out. Every shard of a
split is hashed against index.json when training opens the split, before its first step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from pipeline.errors import DraftlineError
from pipeline.features.store import FeatureStore

KEY_PREFIX = "verifier_layer."
_HINT = "rerun the extract_features stage (dvc repro extract_features)"


def feature_key(layer: int) -> str:
    return f"{KEY_PREFIX}{layer}"


def batch_layers(batch: dict[str, Tensor]) -> dict[int, Tensor]:
    """{layer: (B, T, H)} of the features a batch carries."""
    return {int(key[len(KEY_PREFIX):]): value for key, value in batch.items() if key.startswith(KEY_PREFIX)}


class SplitFeatures:
    """One split's stored layers, checked against the corpus split they belong to and against their sha256."""

    def __init__(self, store: FeatureStore, split: str, layers: frozenset[int], corpus_rows: int,
                 dequantize_to: torch.dtype = torch.float32):
        stored = store.rows(split)
        if stored != corpus_rows:
            raise DraftlineError(f"verifier features at {store.directory} hold {stored} rows of split '{split}', "
                                 f"the corpus {corpus_rows}; {_HINT}")
        store.verify(split)
        self.store, self.split, self.layers, self.dequantize_to = store, split, layers, dequantize_to

    def batch(self, row_ids: Sequence[int], tokens: Sequence[Sequence[int]], width: int) -> dict[str, Tensor]:
        """{`verifier_layer.<i>`: (B, width, H)} for corpus rows `row_ids`, whose training tokens are `tokens`."""
        rows = self.store.read_rows(self.split, row_ids, set(self.layers), self.dequantize_to)
        for row_id, row, expected in zip(row_ids, rows, tokens):
            if row.input_ids.tolist() != list(expected):
                raise DraftlineError(f"verifier features at {self.store.directory}: row {row_id} of split "
                                     f"'{self.split}' holds other tokens than the corpus row; {_HINT}")
        batch = {}
        for layer in sorted(self.layers):
            states = [row.layers[layer] for row in rows]
            padded = states[0].new_zeros((len(rows), width, states[0].shape[-1]))
            for index, state in enumerate(states):
                padded[index, : state.shape[0]] = state
            batch[feature_key(layer)] = padded
        return batch


@dataclass(frozen=True)
class TrainingFeatures:
    """The feature set one kind trains from, the layers it reads (always the last, N) and the dtype fp8 features
    are dequantised to (the verifier head's)."""

    store: FeatureStore
    layers: frozenset[int]
    dequantize_to: torch.dtype

    def split(self, name: str, corpus_rows: int) -> SplitFeatures:
        return SplitFeatures(self.store, name, self.layers, corpus_rows, self.dequantize_to)


def open_training_features(store: FeatureStore, *, kind: str, layers: set[int], dtype: str, verifier_config,
                           verifier_hash: str, corpus_hash: str, max_seq_len: int,
                           dequantize_to: torch.dtype) -> TrainingFeatures:
    """The feature set checked against what `train.<kind>` needs before any row is read: one line on the
    first disagreement (verifier, corpus, depth, width, layers, row length, dtype)."""
    text = verifier_config.get_text_config()
    depth = int(text.num_hidden_layers)
    needed = set(layers) | {depth}
    store.check(verifier_hash=verifier_hash, corpus_hash=corpus_hash, num_layers=depth,
                hidden_size=int(text.hidden_size), layers=needed, max_seq_len=max_seq_len, what=f"train.{kind}")
    if store.index.dtype != dtype:
        raise DraftlineError(f"verifier features at {store.directory} are {store.index.dtype}, params say "
                             f"features.dtype {dtype}; {_HINT}")
    return TrainingFeatures(store, frozenset(needed), dequantize_to)
