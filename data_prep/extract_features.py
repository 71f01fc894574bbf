"""Stage `extract_features`: the verifier's hidden states for every corpus row, as a dataset.

The kinds trained offline (`train.<kind>.features: offline`) read it instead of running the verifier
(format: pipeline/features/store.py).

Rows are `row_sequence(prompt, response, features.max_seq_len)` of every row of every split; the layers are
those the offline kinds read (each kind's `feature_layers`) plus the last, N. Work is cut into shards of
`features.shard_rows` rows, each committed atomically with its fingerprint (verifier and corpus hashes,
layers, dtype, max_seq_len, split, row range) in its safetensors metadata and its sha256 beside it
(`<shard>.sha256`). A restart, even after SIGKILL, reuses a shard whose fingerprint matches and whose bytes
still hash to that sha256, and redoes the others; so the result equals an uninterrupted run's byte for byte.

Many nodes: `--part i/N` extracts only the shards whose global index is i modulo N and writes no index, so
N copies on shared storage split the work; a run without `--part` then reuses every finished shard, removes
files of other inputs and writes `index.json` last (docs/scaling.md#feature-extraction).

No kind trained offline: nothing is extracted, and the output is an index with no layers and no rows (an
empty but valid dataset), so the stage's output is always readable and DVC's graph stays the same.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor
from transformers import AutoConfig

from data_prep.corpus import SPLITS, corpus_hash, load_corpus
from data_prep.feature_engines import FeatureEngine, start_engine
from pipeline.atomic import write_json_atomic, write_text_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config.features_config import FeaturesConfig, offline_kinds, stored_layers
from pipeline.config.stage_params import StageParams
from pipeline.config.train_config import TrainConfig
from pipeline.config.verifier_config import VerifierConfig
from pipeline.errors import DraftlineError, describe_os_error, os_error_behind
from pipeline.features.store import (
    FORMAT_VERSION,
    INDEX_NAME,
    FeatureIndex,
    ShardEntry,
    SplitEntry,
    file_sha256,
    shard_metadata,
    shard_name,
    write_index,
    write_shard,
)
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary, progress
from pipeline.training.corpus_data import row_sequence
from pipeline.verifier_record import model_location, read_record, verifier_identity


class FeaturesParams(StageParams):
    verifier: VerifierConfig = VerifierConfig()
    features: FeaturesConfig = FeaturesConfig()
    train: TrainConfig = TrainConfig()


@dataclass(frozen=True)
class Part:
    """This run's share of the shards: those with global index % count == index."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str | None) -> "Part":
        if text is None:
            return cls()
        index, _, count = text.partition("/")
        if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
            raise DraftlineError(f"--part {text!r}: expected i/N with 0 <= i < N (N copies of the stage, "
                                 "each with its own i: 0/2 and 1/2)")
        return cls(int(index), int(count))

    @property
    def whole(self) -> bool:
        return self.count == 1

    def takes(self, global_index: int) -> bool:
        return global_index % self.count == self.index


@dataclass(frozen=True)
class VerifierShape:
    num_layers: int
    hidden_size: int
    vocab_size: int


def verifier_shape(location: str, trust_remote_code: bool) -> VerifierShape:
    """Depth, width and vocabulary from the verifier's config, without loading its weights."""
    try:
        config = AutoConfig.from_pretrained(location, local_files_only=True,
                                            trust_remote_code=trust_remote_code).get_text_config()
        return VerifierShape(int(config.num_hidden_layers), int(config.hidden_size), int(config.vocab_size))
    except (OSError, ValueError, AttributeError, TypeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DraftlineError(f"cannot read the verifier's config at {location} ({reason}); "
                             "check verifier.name_or_path") from None


@dataclass(frozen=True)
class Shard:
    split: str
    index: int  # within the split
    start: int  # the split's rows [start, end)
    end: int

    @property
    def name(self) -> str:
        return shard_name(self.split, self.index)


def plan_shards(rows: dict[str, list[tuple[list[int], int]]], shard_rows: int) -> list[Shard]:
    """Every split's shards, in one order: a shard's position is its global index, which `--part` deals."""
    return [Shard(split, index, start, min(start + shard_rows, len(rows[split])))
            for split in SPLITS for index, start in enumerate(range(0, len(rows[split]), shard_rows))]


def sha_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def finished_sha(path: Path, fingerprint: dict[str, str]) -> str | None:
    """The shard's sha256 when it is committed for this fingerprint and intact, else None."""
    try:
        recorded = sha_path(path).read_text(encoding="utf-8").split()[0]
        metadata = shard_metadata(path)
    except Exception:  # noqa: BLE001 - missing, truncated or not safetensors: redone all the same
        return None
    if any(metadata.get(key) != value for key, value in fingerprint.items()):
        return None
    return recorded if file_sha256(path) == recorded else None


@dataclass
class Extraction:
    """What the run did, for the index, the summary and metrics/features.json."""

    shas: dict[str, str]  # shard name -> sha256, for the shards of this run's part
    reused: int = 0
    written: int = 0
    tokens_extracted: int = 0
    seconds: float = 0.0  # extraction only: an engine's start is left out of tokens/s
    startup_seconds: float = 0.0
    engine: dict | None = None


def extract(shards: list[Shard], rows: dict[str, list[tuple[list[int], int]]], layers: list[int],
            fingerprint: dict[str, str], params: FeaturesParams, paths: ArtifactPaths,
            location: str) -> Extraction:
    """Commit every shard of `shards` that is not already finished; the engine starts only when one is left."""
    config = params.features
    done = {shard.name: finished_sha(paths.features / shard.name, {**fingerprint, **shard_fingerprint(shard)})
            for shard in shards}
    result = Extraction(shas={})
    bar = progress(desc="extract features", total=sum(shard.end - shard.start for shard in shards), unit="row")
    engine: FeatureEngine | None = None
    with contextlib.ExitStack() as stack:
        for shard in shards:
            shard_rows = rows[shard.split][shard.start : shard.end]
            path = paths.features / shard.name
            if done[shard.name]:
                result.shas[shard.name] = done[shard.name]
                result.reused += 1
                bar.update(len(shard_rows))
                continue
            if path.exists():
                info(f"feature shard {path} is damaged or from other inputs; extracting it again")
            if engine is None:
                (paths.features / INDEX_NAME).unlink(missing_ok=True)  # the dataset is changing: not complete now
                begin = time.perf_counter()
                engine = start_engine(config, location=location, verifier=params.verifier,
                                      log_dir=paths.features)
                stack.callback(engine.close)
                result.startup_seconds, result.engine = time.perf_counter() - begin, engine.describe()
            begin = time.perf_counter()
            states = engine.extract([tokens for tokens, _ in shard_rows], layers)
            result.seconds += time.perf_counter() - begin
            metadata = {**fingerprint, **shard_fingerprint(shard), "engine": json.dumps(result.engine, sort_keys=True)}
            sha_path(path).unlink(missing_ok=True)  # a shard is finished only once its sha is beside it
            sha = write_shard_or_say_why(path, shard_rows, {layer: [row[layer] for row in states] for layer in layers},
                                         config.dtype, metadata)
            write_text_atomic(sha_path(path), f"{sha}  {shard.name}\n")  # the `sha256sum -c` format
            result.shas[shard.name] = sha
            result.written += 1
            result.tokens_extracted += sum(len(tokens) for tokens, _ in shard_rows)
            bar.update(len(shard_rows))
            bar.set_postfix(tokens=result.tokens_extracted)
    bar.close()
    return result


def write_shard_or_say_why(path: Path, rows: list[tuple[list[int], int]], layers: dict[int, list[Tensor]],
                           dtype: str, metadata: dict[str, str]) -> str:
    """`write_shard`, except that a failed write leaves no partial file of the shard, and a full disk (which
    safetensors reports as its own error type, "... (os error 28)") is one line naming the shard's path, what is
    free there and at least what the shard needed (its hidden states). Finished shards stay: a rerun extracts only the rest."""
    try:
        return write_shard(path, rows, layers, dtype, metadata)
    except BaseException as error:
        for partial in path.parent.glob(f"{path.name}.*"):  # the writer's temporary `<shard>.partial`
            partial.unlink(missing_ok=True)
        behind = os_error_behind(error, path) if isinstance(error, Exception) else None
        if behind is None or behind.errno != errno.ENOSPC:
            raise
        itemsize = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        needed = sum(state.numel() for states in layers.values() for state in states) * itemsize
        raise DraftlineError(describe_os_error(behind, needed=needed)) from None


def shard_fingerprint(shard: Shard) -> dict[str, str]:
    return {"split": shard.split, "start": str(shard.start), "end": str(shard.end)}


def remove_stale(directory: Path, keep: set[str]) -> int:
    """Remove what is not one of this run's shards (other inputs' shards, a killed write's partial file);
    an engine's log (`*.log`) stays for whoever debugs it."""
    removed = 0
    for entry in directory.iterdir() if directory.is_dir() else ():
        if entry.name not in keep and entry.suffix != ".log":
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            removed += 1
    return removed


def build_index(shards: list[Shard], rows: dict[str, list[tuple[list[int], int]]], shas: dict[str, str],
                fingerprint: dict[str, str], layers: list[int], shape: VerifierShape, config: FeaturesConfig,
                engine: dict) -> FeatureIndex:
    splits = {}
    for split in SPLITS if layers else ():
        entries = [ShardEntry(file=shard.name, start=shard.start, end=shard.end, sha256=shas[shard.name],
                              tokens=sum(len(tokens) for tokens, _ in rows[split][shard.start : shard.end]))
                   for shard in shards if shard.split == split]
        splits[split] = SplitEntry(rows=len(rows[split]), tokens=sum(entry.tokens for entry in entries),
                                   shards=entries)
    return FeatureIndex(verifier_hash=fingerprint["verifier_hash"], corpus_hash=fingerprint["corpus_hash"],
                        layers=layers, num_layers=shape.num_layers, hidden_size=shape.hidden_size,
                        dtype=config.dtype, max_seq_len=config.max_seq_len, splits=splits, engine=engine)


def run(params: FeaturesParams, args: argparse.Namespace) -> None:
    part = Part.parse(args.part)
    config = params.features
    paths = ArtifactPaths.from_params(params)
    identity = verifier_identity(paths)
    location = model_location(paths, read_record(paths))
    shape = verifier_shape(location, params.verifier.trust_remote_code)
    corpus = load_corpus(paths, shape.vocab_size)
    kinds = offline_kinds(params.train)
    layers = stored_layers(params.train, kinds, shape.num_layers)
    rows = {split: [row_sequence(prompt, response, config.max_seq_len)
                    for prompt, response in zip(corpus[split]["prompt_ids"], corpus[split]["response_ids"])]
            for split in SPLITS} if layers else {split: [] for split in SPLITS}
    fingerprint = {"format": str(FORMAT_VERSION), "verifier_hash": identity["hash"], "corpus_hash": corpus_hash(paths),
                   "layers": ",".join(map(str, layers)), "dtype": config.dtype, "max_seq_len": str(config.max_seq_len),
                   "num_layers": str(shape.num_layers), "hidden_size": str(shape.hidden_size)}
    shards = plan_shards(rows, config.shard_rows)
    mine = [shard for position, shard in enumerate(shards) if part.takes(position)]
    if not layers:
        info("no kind trains offline (train.<kind>.features): nothing to extract")
    else:
        info(f"{sum(map(len, rows.values()))} rows in {len(shards)} shards of {config.shard_rows}, layers {layers}, "
             f"{config.dtype}, engine {config.engine}"
             + ("" if part.whole else f"; part {part.index}/{part.count}: {len(mine)} shards"))
    paths.features.mkdir(parents=True, exist_ok=True)
    result = extract(mine, rows, layers, fingerprint, params, paths, location)
    tokens = sum(len(tokens) for split_rows in rows.values() for tokens, _ in split_rows)
    summary = {
        "rows": sum(map(len, rows.values())), "tokens": tokens, "layers": ", ".join(map(str, layers)) or "none",
        "dtype": config.dtype,
        "shards reused / written": f"{result.reused} / {result.written} of {len(mine)}",
        "tokens/s": round(result.tokens_extracted / result.seconds, 1) if result.seconds else "n/a (all reused)",
        "engine start seconds": round(result.startup_seconds, 1),
    }
    if not part.whole:  # the run without --part indexes the shards every part wrote
        print_summary(f"extract_features part {part.index}/{part.count}", {**summary, "output": str(paths.features)})
        return
    keep = {shard.name for shard in shards} | {sha_path(Path(shard.name)).name for shard in shards}
    removed = remove_stale(paths.features, keep)
    engine = result.engine or (recorded_engine(paths.features / shards[0].name) if shards else {})
    index = build_index(shards, rows, result.shas, fingerprint, layers, shape, config, engine)
    write_index(paths.features, index)
    total_bytes = sum((paths.features / shard.name).stat().st_size for shard in shards)
    metrics = {
        "rows": summary["rows"], "tokens": tokens, "layers": layers, "dtype": config.dtype,
        "hidden_size": shape.hidden_size, "offline_kinds": kinds, "bytes": total_bytes,
        "bytes_per_token": round(total_bytes / tokens, 1) if tokens else None,
        "tokens_per_s": summary["tokens/s"] if result.seconds else None,
        "shards": {"total": len(shards), "reused": result.reused, "written": result.written},
        "engine": engine, "verifier": identity,
    }
    write_json_atomic(paths.metrics / "features.json", metrics)
    print_summary("extract_features", {
        **summary,
        "bytes/token": metrics["bytes_per_token"] or "n/a", "total bytes": f"{total_bytes / 2**20:.1f} MiB",
        "stale files removed": removed, "output": str(paths.features),
    })


def recorded_engine(path: Path) -> dict:
    """The engine a reused shard was made by (its metadata), for the index of a run that extracted nothing."""
    return json.loads(shard_metadata(path).get("engine", "{}"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline extract_features", __doc__.splitlines()[0])
    parser.add_argument("--part", help="i/N: extract only shard i of every N (one of N copies on shared storage); "
                                       "writes no index: a run without --part merges")
    return run_stage(parser, FeaturesParams, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
