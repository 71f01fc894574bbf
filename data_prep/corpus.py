"""The corpus artifact: a `DatasetDict` (train/validation/test) of verifier responses."""

from __future__ import annotations

from datasets import DatasetDict

from pipeline.errors import DraftlineError
from pipeline.lineage import hash_dir
from pipeline.paths import ArtifactPaths

SPLITS = ("train", "validation", "test")
COLUMNS = ("id", "domain", "source", "prompt", "prompt_ids", "response_ids", "finish_reason", "temperature", "seed")
STATS_NAME = "stats.json"
_HINT = "run `dvc repro build_corpus` (or `draftline build_corpus`)"


def load_corpus(paths: ArtifactPaths) -> DatasetDict:
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
    return corpus


def corpus_hash(paths: ArtifactPaths) -> str:
    if not paths.corpus.is_dir():
        raise DraftlineError(f"no corpus at {paths.corpus}; {_HINT}")
    return hash_dir(paths.corpus)
