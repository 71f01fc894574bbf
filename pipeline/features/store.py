"""The verifier's features as a dataset: sharded safetensors plus an index, written by `extract_features`
and streamed by offline training.

Layout of `artifacts/features/`:
- `index.json` (`FeatureIndex`): what was extracted (verifier and corpus hashes, layers, dtype, width,
  `max_seq_len`) and every split's shards with their row ranges, token counts and sha256;
- `<split>-<nnnnn>.safetensors`: for rows [start, end) of the split, concatenated along tokens:
  `input_ids` (tokens,) int64, `offsets` (rows + 1,) int64 (row r is tokens offsets[r]:offsets[r+1]),
  `prompt_lens` (rows,) int64 and one `layer.<i>` (tokens, hidden) per stored layer.

Layer numbers are HF `output_hidden_states` indices (0 the embeddings, i the output of decoder layer i),
with one exception: the last layer N is stored *before* the final norm (HF's `hidden_states[N]` is after
it), so training recomputes the verifier's logits with its final norm and LM head only and every kind
reads HF's `hidden_states[N]` as `norm(layer.N)`.

Reads map a shard only while a batch's rows are copied out of it (`FeatureStore.read_rows`): a training
process holds one batch of features at a time, so its RAM does not grow with the corpus.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal, Sequence

import torch
from pydantic import BaseModel, ValidationError
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from pipeline.atomic import _umask_mode, write_json_atomic
from pipeline.errors import DraftlineError

INDEX_NAME = "index.json"
METADATA_KEY = "draftline"  # the one safetensors metadata key of a shard: its `metadata`, as JSON
FORMAT_VERSION = 1
FeatureDType = Literal["float32", "bfloat16", "float16"]
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

    @property
    def bytes(self) -> int:
        width = torch.finfo(getattr(torch, self.dtype)).bits // 8
        tokens = sum(split.tokens for split in self.splits.values())
        return tokens * (width * self.hidden_size * len(self.layers) + 8)


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
        tensors[f"layer.{layer}"] = torch.cat(states).to(getattr(torch, dtype)).contiguous()
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

    def _offsets_of(self, shard: ShardEntry, handle) -> Tensor:
        if shard.file not in self._offsets:
            offsets = handle.get_tensor("offsets")
            if offsets.numel() != shard.end - shard.start + 1 or int(offsets[-1]) != shard.tokens:
                raise DraftlineError(f"feature shard {self.directory / shard.file} disagrees with {INDEX_NAME} on its "
                                     f"rows; {_HINT}")
            self._offsets[shard.file] = offsets
        return self._offsets[shard.file]

    def read_rows(self, split: str, rows: Sequence[int], layers: set[int] | None = None) -> list[FeatureRow]:
        """Rows `rows` of `split` (their tokens, prompt lengths and `layers`, default all stored, in the stored
        dtype), in that order. Each shard is mapped only while its rows are copied out, so a long run's RSS holds
        one batch of features, never the pages of every shard it has read."""
        wanted = self.index.layers if layers is None else sorted(layers)
        by_shard: dict[str, list[int]] = {}
        shards: dict[str, ShardEntry] = {}
        for row in rows:
            shard = self._shard(split, row)
            shards[shard.file] = shard
            by_shard.setdefault(shard.file, []).append(row)
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
                            layers={layer: handle.get_slice(f"layer.{layer}")[start:end] for layer in wanted},
                            num_layers=self.index.num_layers,
                        )
            except DraftlineError:
                raise
            except Exception as error:  # safetensors raises its own error types for a damaged file
                raise DraftlineError(f"feature shard {path} is unreadable ({error.__class__.__name__}); {_HINT}") from None
        return [read[row] for row in rows]

