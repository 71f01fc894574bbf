"""The corpus artifact: a `DatasetDict` (train/validation/test) of verifier responses."""

from __future__ import annotations

import pyarrow.compute as pc
from datasets import DatasetDict

from pipeline.errors import DraftlineError
from pipeline.lineage import hash_dir
from pipeline.paths import ArtifactPaths

SPLITS = ("train", "validation", "test")
COLUMNS = ("id", "domain", "source", "prompt", "prompt_ids", "response_ids", "finish_reason", "temperature", "seed")
STATS_NAME = "stats.json"
_HINT = "run `dvc repro build_corpus` (or `draftline build_corpus`)"


def load_corpus(paths: ArtifactPaths, vocab_size: int | None = None) -> DatasetDict:
    """The corpus, checked for the splits and columns the contract promises and, given the verifier's
    `vocab_size`, for token ids it can embed (an out-of-range id would crash training mid-way)."""
    if not paths.corpus.is_dir():
        raise DraftlineError(f"no corpus at {paths.corpus}; {_HINT}")
    try:
        corpus = DatasetDict.load_from_disk(str(paths.corpus))
    except Exception as error:  # datasets raises many types for damaged files
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DraftlineError(f"corpus at {paths.corpus} is corrupt ({reason}); delete it and {_HINT}") from None
    missing_splits = [split for split in SPLITS if split not in corpus]
    if missing_splits:
        raise DraftlineError(f"corpus at {paths.corpus} lacks split(s) {missing_splits}; delete it and {_HINT}")
    for split in SPLITS:
        missing = [column for column in COLUMNS if column not in corpus[split].column_names]
        if missing:
            raise DraftlineError(f"corpus split '{split}' lacks column(s) {missing}; delete it and {_HINT}")
    if vocab_size is not None:
        _check_token_ids(corpus, vocab_size)
    return corpus


def _check_token_ids(corpus: DatasetDict, vocab_size: int) -> None:
    for split in SPLITS:
        table = corpus[split].data.table
        for column in ("prompt_ids", "response_ids"):
            values = pc.list_flatten(table.column(column))
            if len(values) == 0:
                continue
            low, high = pc.min_max(values).values()
            if low.as_py() < 0 or high.as_py() >= vocab_size:
                raise DraftlineError(
                    f"corpus split '{split}' column '{column}' has token ids in [{low.as_py()}, {high.as_py()}], "
                    f"outside the verifier's vocabulary of {vocab_size}; it was built with another tokenizer: "
                    f"delete it and {_HINT}"
                )


def corpus_hash(paths: ArtifactPaths) -> str:
    if not paths.corpus.is_dir():
        raise DraftlineError(f"no corpus at {paths.corpus}; {_HINT}")
    return hash_dir(paths.corpus)
