"""The verifier's features as a dataset: sharded safetensors plus an index, written by `extract_features`
and streamed by offline training.

Layout of `artifacts/features/`:
- `index.json` (`FeatureIndex`): what was extracted (verifier and corpus hashes, layers, dtype, width,
  `max_seq_len`) and every split's shards with their row ranges, token counts and sha256;
- `<split>-<nnnnn>.safetensors`: for rows [start, end) of the split, concatenated along tokens:
  `input_ids` (tokens,) int64, `offsets` (rows + 1,) int64 (row r is tokens offsets[r]:offsets[r+1]),
  `prompt_lens` (rows,) int64 and one `layer.<i>` (tokens, hidden) per stored layer; in `float8_e4m3` also one
  `scale.<i>` (tokens,) float32 per layer: token t's states are `layer.<i>[t] * scale.<i>[t]`, the scale its
  largest |state| / 448 (e4m3's largest value), so every token uses the format's whole range.

Layer numbers are HF `output_hidden_states` indices (0 the embeddings, i the output of decoder layer i),
with one exception: the last layer N is stored *before* the final norm (HF's `hidden_states[N]` is after
it), so training recomputes the verifier's logits with its final norm and LM head only and every kind
reads HF's `hidden_states[N]` as `norm(layer.N)`.

Reads map a shard only while a batch's rows are copied out of it (`FeatureStore.read_rows`): a training
process holds one batch of features at a time, so its RAM does not grow with the corpus. Before a shard's
first row is read, its bytes are hashed (streamed) against the sha256 `index.json` records for it, once per
shard per process: a shard changed after extraction stops the reader with one line instead of training on it.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch
from pydantic import BaseModel, ValidationError
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from pipeline.atomic import _umask_mode, write_json_atomic
from pipeline.config.features_config import FeatureDType
from pipeline.errors import DraftlineError

INDEX_NAME = "index.json"
METADATA_KEY = "draftline"  # the one safetensors metadata key of a shard: its `metadata`, as JSON
FORMAT_VERSION = 1
FP8: FeatureDType = "float8_e4m3"
STORED_TYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                        "float16": torch.float16, FP8: torch.float8_e4m3fn}
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
SCALE_BYTES = 4  # a float32 scale per token and layer (fp8 only)
ID_BYTES = 8  # a token's id, int64
_HINT = "rerun the extract_features stage (dvc repro extract_features)"


class ShardEntry(BaseModel):
    file: str
    start: int  # first row of the split in this shard
    end: int  # one past the last
    tokens: int
    sha256: str


class SplitEntry(BaseModel):
    rows: int
    tokens: int
    shards: list[ShardEntry]


class FeatureIndex(BaseModel):
    format: int = FORMAT_VERSION
    verifier_hash: str
    corpus_hash: str
    layers: list[int]  # sorted; the last one is the verifier's depth, stored before the final norm
    num_layers: int  # the verifier's depth N
    hidden_size: int
    dtype: FeatureDType
    max_seq_len: int  # rows are `row_sequence(prompt, response, max_seq_len)`
    splits: dict[str, SplitEntry]
    engine: dict = {}

    def content_hash(self) -> str:
        """The feature set's identity: every shard's sha256 in order (the dtype, the engine's numbers and the rows
        are in those bytes). Another extraction of the same corpus, in another dtype say, is another feature set."""
        shas = [shard.sha256 for split in sorted(self.splits) for shard in self.splits[split].shards]
        return hashlib.sha256("\n".join(shas).encode()).hexdigest()


def token_bytes(dtype: FeatureDType, hidden_size: int, layers: int) -> int:
    """A shard's bytes per token: its id and `layers` x `hidden_size` states (with fp8 each layer's scale); a row
    adds 16 (its offset and prompt length) and a shard its header, a few KiB."""
    scale = SCALE_BYTES if dtype == FP8 else 0
    return ID_BYTES + layers * (STORED_TYPES[dtype].itemsize * hidden_size + scale)


def quantize_fp8(states: Tensor) -> tuple[Tensor, Tensor]:
    """(tokens, hidden) -> (e4m3 values, float32 scale per token). A token's scale maps its largest |state| to
    e4m3's largest, so small and large tokens alike keep e4m3's 3-bit mantissa (relative error <= 1/16)."""
    states = states.float()
    amax = states.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))  # an all-zero token stays zero
    values = (states / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values.contiguous(), scale.contiguous()


def dequantize_fp8(values: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    return (values.float() * scale[:, None]).to(dtype)


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.safetensors"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_shard(path: Path, rows: list[tuple[list[int], int]], layers: dict[int, list[Tensor]], dtype: FeatureDType,
                metadata: dict[str, str]) -> str:
    """Write one shard atomically; returns its sha256. `rows` are (tokens, prompt length); `layers[i][r]` is row r's
    (tokens_r, hidden) states of layer i. The tensors and metadata fully determine the bytes, so a shard redone
    after a crash is byte-identical to the one the uninterrupted run wrote."""
    lengths = torch.tensor([len(tokens) for tokens, _ in rows], dtype=torch.int64)
    tensors = {
        "input_ids": torch.tensor([token for tokens, _ in rows for token in tokens], dtype=torch.int64),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]),
        "prompt_lens": torch.tensor([prompt_len for _, prompt_len in rows], dtype=torch.int64),
    }
    for layer, states in layers.items():
        if [state.shape[0] for state in states] != lengths.tolist():
            raise DraftlineError(f"layer {layer}'s states do not cover the shard's rows token for token")
        stored = torch.cat(states)
        if dtype == FP8:
            tensors[f"layer.{layer}"], tensors[f"scale.{layer}"] = quantize_fp8(stored)
        else:
            tensors[f"layer.{layer}"] = stored.to(STORED_TYPES[dtype]).contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    # safetensors writes its metadata map in hash order, which differs from process to process: one key holding
    # sorted JSON keeps the bytes a function of the inputs
    save_file(tensors, str(partial), metadata={METADATA_KEY: json.dumps(metadata, sort_keys=True)})
    partial.chmod(_umask_mode(0o666))  # safetensors creates it private; a server running as another user reads it
    partial.replace(path)
    return file_sha256(path)


def shard_metadata(path: Path) -> dict[str, str]:
    """The `metadata` a shard was written with (safetensors raises its own errors for a damaged file)."""
    with safe_open(str(path), framework="pt") as handle:
        return json.loads((handle.metadata() or {}).get(METADATA_KEY, "{}"))


def write_index(directory: Path, index: FeatureIndex) -> None:
    write_json_atomic(directory / INDEX_NAME, index.model_dump(mode="json"))


def read_index(directory: Path) -> FeatureIndex:
    path = directory / INDEX_NAME
    if not path.is_file():
        raise DraftlineError(f"no verifier features at {directory} ({INDEX_NAME} missing); {_HINT}")
    try:
        index = FeatureIndex.model_validate_json(path.read_text(encoding="utf-8"))
    except (ValidationError, UnicodeDecodeError) as error:
        raise DraftlineError(f"{path} is not a draftline feature index ({error.__class__.__name__}); {_HINT}") from None
    if index.format != FORMAT_VERSION:
        raise DraftlineError(f"{path} has feature format {index.format}, this draftline reads {FORMAT_VERSION}; {_HINT}")
    return index


class FeatureRow:
    """One corpus row's tokens, prompt length and stored layers (`layers[N]` before the final norm)."""

    def __init__(self, input_ids: Tensor, prompt_len: int, layers: dict[int, Tensor], num_layers: int):
        self.input_ids, self.prompt_len, self.layers, self.num_layers = input_ids, prompt_len, layers, num_layers


class FeatureStore:
    """Read access to an extracted feature dataset, checked against what training expects before any row is read."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.index = read_index(directory)
        self._offsets: dict[str, Tensor] = {}  # per shard: small, read once
        self._verified: set[str] = set()  # shards whose bytes hashed to index.json's sha256 in this process

    def check(self, *, verifier_hash: str, corpus_hash: str, num_layers: int, hidden_size: int,
              layers: set[int], max_seq_len: int, what: str) -> None:
        """One line naming the first disagreement between the stored features and what `what` needs."""
        index, fix = self.index, _HINT
        problems = [
            (index.verifier_hash != verifier_hash, "were extracted from another verifier"),
            (index.corpus_hash != corpus_hash, "were extracted from another corpus"),
            (index.num_layers != num_layers or index.hidden_size != hidden_size,
             f"are {index.num_layers} layers x {index.hidden_size} wide, the verifier {num_layers} x {hidden_size}"),
            (not layers <= set(index.layers),
             f"hold layers {index.layers}, {what} reads {sorted(layers)}"),
            (index.max_seq_len != max_seq_len,
             f"cut rows at features.max_seq_len {index.max_seq_len}, {what} at max_seq_len {max_seq_len} "
             "(set them equal)"),
        ]
        for failed, problem in problems:
            if failed:
                raise DraftlineError(f"verifier features at {self.directory} {problem}; {fix}")

    def rows(self, split: str) -> int:
        return self.index.splits[split].rows if split in self.index.splits else 0

    def _shard(self, split: str, row: int) -> ShardEntry:
        entry = self.index.splits.get(split)
        if entry is None or not 0 <= row < entry.rows:
            raise DraftlineError(f"verifier features at {self.directory} have no row {row} of split '{split}'; {_HINT}")
        for shard in entry.shards:
            if shard.start <= row < shard.end:
                return shard
        raise DraftlineError(f"verifier features at {self.directory}: no shard holds row {row} of '{split}'; {_HINT}")

    def verify(self, split: str) -> None:
        """Hash every shard of `split` against its sha256 in index.json before any is read, so that a reader fails
        before its first step, not mid-run."""
        entry = self.index.splits.get(split)
        self._verify(entry.shards if entry else [])

    def _verify(self, shards: list[ShardEntry]) -> None:
        """Each shard once per process, streamed, a few at a time (hashlib hashes without holding the GIL)."""
        pending = [shard for shard in shards if shard.file not in self._verified]
        if not pending:
            return
        pool = ThreadPoolExecutor(max_workers=min(4, len(pending), os.cpu_count() or 1))
        try:
            for shard in pool.map(self._hash_matches, pending):  # raises the first mismatch, in shard order
                self._verified.add(shard.file)
        finally:
            pool.shutdown(cancel_futures=True)  # after a mismatch, the shards not yet started are not hashed

    def _hash_matches(self, shard: ShardEntry) -> ShardEntry:
        path = self.directory / shard.file
        try:
            actual = file_sha256(path)
        except OSError as error:
            raise DraftlineError(f"feature shard {path} is unreadable ({error.strerror or type(error).__name__}); "
                                 f"{_HINT}") from None
        if actual != shard.sha256:
            raise DraftlineError(f"feature shard {path} does not match the sha256 {INDEX_NAME} records for it "
                                 f"(changed after extraction); {_HINT}, which extracts it again")
        return shard

    def _offsets_of(self, shard: ShardEntry, handle) -> Tensor:
        if shard.file not in self._offsets:
            offsets = handle.get_tensor("offsets")
            if offsets.numel() != shard.end - shard.start + 1 or int(offsets[-1]) != shard.tokens:
                raise DraftlineError(f"feature shard {self.directory / shard.file} disagrees with {INDEX_NAME} on its "
                                     f"rows; {_HINT}")
            self._offsets[shard.file] = offsets
        return self._offsets[shard.file]

    def read_rows(self, split: str, rows: Sequence[int], layers: set[int] | None = None,
                  dequantize_to: torch.dtype = torch.float32) -> list[FeatureRow]:
        """Rows `rows` of `split` (their tokens, prompt lengths and `layers`, default all stored), in that order.
        States come in the stored dtype, except fp8, which nothing computes in: dequantised to `dequantize_to`
        row by row. Each shard is mapped only while its rows are copied out, so a long run's RSS holds one batch
        of features, never the pages of every shard it has read; a shard is hashed before its first read."""
        wanted = self.index.layers if layers is None else sorted(layers)
        by_shard: dict[str, list[int]] = {}
        shards: dict[str, ShardEntry] = {}
        for row in rows:
            shard = self._shard(split, row)
            shards[shard.file] = shard
            by_shard.setdefault(shard.file, []).append(row)
        self._verify(list(shards.values()))
        read: dict[int, FeatureRow] = {}
        for name, shard_rows in by_shard.items():
            shard, path = shards[name], self.directory / name
            try:
                with safe_open(str(path), framework="pt") as handle:
                    offsets = self._offsets_of(shard, handle)
                    prompt_lens = handle.get_tensor("prompt_lens")
                    for row in shard_rows:
                        local = row - shard.start
                        start, end = int(offsets[local]), int(offsets[local + 1])
                        read[row] = FeatureRow(
                            input_ids=handle.get_slice("input_ids")[start:end],
                            prompt_len=int(prompt_lens[local]),
                            layers={layer: self._states(handle, layer, start, end, dequantize_to)
                                    for layer in wanted},
                            num_layers=self.index.num_layers,
                        )
            except DraftlineError:
                raise
            except Exception as error:  # safetensors raises its own error types for a damaged file
                raise DraftlineError(f"feature shard {path} is unreadable ({error.__class__.__name__}); {_HINT}") from None
        return [read[row] for row in rows]

    def _states(self, handle, layer: int, start: int, end: int, dequantize_to: torch.dtype) -> Tensor:
        values = handle.get_slice(f"layer.{layer}")[start:end]
        if self.index.dtype != FP8:
            return values
        return dequantize_fp8(values, handle.get_slice(f"scale.{layer}")[start:end], dequantize_to)
