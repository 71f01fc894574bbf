"""The feature store's formats and its read-side integrity: float8_e4m3 with a scale per token and layer keeps
e4m3's relative precision on tokens of any magnitude at half bfloat16's bytes (plus the scales), and a shard
whose bytes changed after extraction is refused before any of its rows is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.errors import DraftlineError
from pipeline.features import store as store_module
from pipeline.features.store import (
    FeatureIndex,
    FeatureStore,
    ShardEntry,
    SplitEntry,
    shard_name,
    token_bytes,
    write_index,
    write_shard,
)
from tests.support.features import overwrite_tail

LAYERS = (1, 2, 3)


def make_rows(rows: int, hidden: int, seed: int = 0) -> tuple[list[tuple[list[int], int]], dict[int, list[torch.Tensor]]]:
    """`rows` rows of 5..20 tokens whose states span 1e-4..1e4 in magnitude from token to token, and one all-zero
    token: a single scale for the whole tensor would flush the small tokens to zero."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 21, (rows,), generator=generator).tolist()
    token_rows = [(list(range(length)), 2) for length in lengths]
    layers = {}
    for layer in LAYERS:
        states = []
        for length in lengths:
            magnitude = 10 ** (torch.rand(length, 1, generator=generator) * 8 - 4)
            states.append(torch.randn(length, hidden, generator=generator) * magnitude)
        states[0][0] = 0.0
        layers[layer] = states
    return token_rows, layers


def write_store(directory: Path, dtype: str, rows: int = 6, hidden: int = 64) -> tuple[FeatureStore, dict]:
    """One training shard of `rows` rows in `dtype`, indexed as extract_features indexes it; returns the store
    and the float32 states written."""
    token_rows, layers = make_rows(rows, hidden)
    name = shard_name("train", 0)
    sha = write_shard(directory / name, token_rows, layers, dtype, {"dtype": dtype})
    tokens = sum(len(tokens) for tokens, _ in token_rows)
    shard = ShardEntry(file=name, start=0, end=rows, tokens=tokens, sha256=sha)
    write_index(directory, FeatureIndex(
        verifier_hash="v", corpus_hash="c", layers=list(LAYERS), num_layers=3, hidden_size=hidden, dtype=dtype,
        max_seq_len=32, splits={"train": SplitEntry(rows=rows, tokens=tokens, shards=[shard])}))
    return FeatureStore(directory), layers


def test_float8_round_trip_keeps_e4m3_precision_per_token(tmp_path):
    store, written = write_store(tmp_path, "float8_e4m3")
    read = store.read_rows("train", range(6))
    for layer in LAYERS:
        for row, states in zip(read, written[layer]):
            back = row.layers[layer]
            assert back.dtype == torch.float32 and back.shape == states.shape
            scale = states.abs().amax(dim=-1, keepdim=True) / 448
            # e4m3: 3 mantissa bits, so a normal value is within 1/16 of itself; below e4m3's smallest normal
            # (2^-6 of the scale) its spacing is 2^-9, so within 2^-10 of the token's scale
            bound = torch.maximum(states.abs() / 16, scale / 2**10)
            assert ((back - states).abs() <= bound * (1 + 1e-6)).all()
            largest = states.abs().argmax(dim=-1)
            torch.testing.assert_close(back.gather(-1, largest[:, None]), states.gather(-1, largest[:, None]))
    assert not read[0].layers[1][0].any()  # the all-zero token stays zero (no 0/0)
    (in_bf16,) = store.read_rows("train", [1], dequantize_to=torch.bfloat16)
    assert in_bf16.layers[2].dtype == torch.bfloat16


def test_float8_shard_is_half_of_bfloat16_plus_its_scales(tmp_path):
    sizes = {}
    for dtype in ("bfloat16", "float8_e4m3"):
        store, _ = write_store(tmp_path / dtype, dtype, rows=16, hidden=256)
        tokens = store.index.splits["train"].tokens
        size = (tmp_path / dtype / shard_name("train", 0)).stat().st_size
        # what `draftline features estimate` predicts: a token's bytes, 16 a row, and a header under 1 KiB
        assert 0 <= size - tokens * token_bytes(dtype, 256, len(LAYERS)) - 16 * 16 < 1024
        sizes[dtype] = size
    scales = tokens * len(LAYERS) * 4
    ids = tokens * 8
    # the states in e4m3 are exactly half of bfloat16's; the ids, offsets and header are the same in both
    assert sizes["float8_e4m3"] - scales - ids == pytest.approx((sizes["bfloat16"] - ids) / 2, abs=1024)
    assert sizes["float8_e4m3"] / sizes["bfloat16"] < 0.52


@pytest.mark.parametrize("dtype", ["float32", "float8_e4m3"])
def test_a_shard_changed_after_extraction_is_refused_at_read(tmp_path, dtype):
    store, _ = write_store(tmp_path, dtype)
    overwrite_tail(tmp_path / shard_name("train", 0))
    with pytest.raises(DraftlineError, match=r"feature shard .*train-00000\.safetensors does not match the sha256 "
                                             r"index\.json records for it .*rerun the extract_features stage"):
        store.read_rows("train", [0])
    with pytest.raises(DraftlineError, match="does not match the sha256"):
        FeatureStore(tmp_path).verify("train")


def test_each_shard_is_hashed_once_per_store(tmp_path, monkeypatch):
    store, _ = write_store(tmp_path, "bfloat16")
    hashed = []
    real = store_module.file_sha256
    monkeypatch.setattr(store_module, "file_sha256", lambda path: hashed.append(path.name) or real(path))
    store.verify("train")
    store.read_rows("train", [0, 3])
    store.read_rows("train", [5])
    assert hashed == [shard_name("train", 0)]

