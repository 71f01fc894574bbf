"""Verifier features for a tiny workspace, written the way `extract_features` writes them
(pipeline/features/store.py): every corpus row, one HF forward each, all layers (the last before the final norm)."""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import load_from_disk
from torch import Tensor

from data_prep.corpus import corpus_hash
from pipeline.config.trainer_config import TrainerConfig
from pipeline.features.store import FeatureIndex, ShardEntry, SplitEntry, shard_name, write_index, write_shard
from pipeline.paths import ArtifactPaths
from pipeline.training.corpus_data import row_sequence
from pipeline.verifier_record import verifier_identity

MAX_SEQ_LEN = TrainerConfig().max_seq_len  # the default every kind trains at, so params need not set it
FEATURES_PARAMS = {"dtype": "float32"}  # params.yaml `features` for these features


@torch.no_grad()
def row_states(model, tokens: list[int]) -> dict[int, Tensor]:
    """HF `hidden_states` of one row, with the last layer taken before the final norm, as the store keeps it."""
    captured = {}
    hook = model.get_decoder().norm.register_forward_pre_hook(lambda _, args: captured.setdefault("last", args[0]))
    try:
        out = model(torch.tensor([tokens]), output_hidden_states=True)
    finally:
        hook.remove()
    states = {layer: state[0] for layer, state in enumerate(out.hidden_states)}
    states[len(out.hidden_states) - 1] = captured["last"][0]
    return states


def write_features(artifacts: Path, model, *, max_seq_len: int = MAX_SEQ_LEN, dtype: str = "float32",
                   layers: set[int] | None = None, shard_rows: int = 8) -> FeatureIndex:
    """`artifacts/features/` from `model` (the workspace's verifier) over `artifacts/corpus`; `layers` default
    all. The index binds them to the verifier and corpus now in `artifacts/`."""
    depth = model.config.num_hidden_layers
    kept = sorted(set(range(depth + 1)) if layers is None else set(layers) | {depth})
    directory, corpus, splits = artifacts / "features", load_from_disk(str(artifacts / "corpus")), {}
    for split in corpus:
        rows = [row_sequence(prompt, response, max_seq_len)
                for prompt, response in zip(corpus[split]["prompt_ids"], corpus[split]["response_ids"])]
        shards = []
        for number, start in enumerate(range(0, len(rows), shard_rows)):
            chunk = rows[start : start + shard_rows]
            states = [row_states(model, tokens) for tokens, _ in chunk]
            name = shard_name(split, number)
            sha = write_shard(directory / name, chunk, {layer: [row[layer] for row in states] for layer in kept},
                              dtype, metadata={"split": split})
            shards.append(ShardEntry(file=name, start=start, end=start + len(chunk),
                                     tokens=sum(len(tokens) for tokens, _ in chunk), sha256=sha))
        splits[split] = SplitEntry(rows=len(rows), tokens=sum(shard.tokens for shard in shards), shards=shards)
    paths = ArtifactPaths(root=artifacts, metrics=artifacts.parent / "metrics", plots=artifacts.parent / "plots")
    index = FeatureIndex(verifier_hash=verifier_identity(paths)["hash"], corpus_hash=corpus_hash(paths), layers=kept,
                         num_layers=depth, hidden_size=model.config.hidden_size, dtype=dtype, max_seq_len=max_seq_len,
                         splits=splits)
    write_index(directory, index)
    return index
