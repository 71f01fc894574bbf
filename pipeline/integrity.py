"""Artifacts checked before they are loaded: a truncated or edited file is one clear line, not a
loader traceback (or, worse, a model that loads and computes garbage)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open
from transformers import PreTrainedTokenizerBase

from pipeline.errors import DraftlineError
from pipeline.lineage import hash_file

MASK_TOKEN = "<|mask|>"  # the block drafter's mask token, when a tokenizer has no mask_token of its own


def verify_manifest(directory: Path, manifest_name: str = "manifest.json") -> None:
    """Every file the export's manifest lists must still have its recorded size and sha256."""
    manifest_path = directory / manifest_name
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DraftlineError(f"{manifest_path} is unreadable ({error}); re-run `dvc repro export`") from None
    for relative, recorded in sorted(files.items()):
        path = directory / relative
        if not path.is_file():
            raise DraftlineError(f"{path} listed in {manifest_path} is missing; re-run `dvc repro export`")
        if path.stat().st_size != recorded["bytes"] or hash_file(path) != recorded["sha256"]:
            raise DraftlineError(
                f"{path} differs from {manifest_path} (truncated or edited after export); re-run `dvc repro export`"
            )


def safetensors_shapes(directory: Path, fix: str) -> dict[str, list[int]]:
    """Tensor name -> shape from the headers of every `*.safetensors` file (no weights are read)."""
    shapes: dict[str, list[int]] = {}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise DraftlineError(f"{directory} has no *.safetensors weights; {fix}")
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    shapes[name] = list(handle.get_slice(name).get_shape())
        except (SafetensorError, OSError) as error:
            raise DraftlineError(f"{path} is truncated or corrupt ({str(error).splitlines()[0]}); {fix}") from None
        expected_end = _safetensors_data_end(path)
        if path.stat().st_size < expected_end:
            raise DraftlineError(
                f"{path} is truncated ({path.stat().st_size} of {expected_end} bytes); {fix}"
            )
    return shapes


def _safetensors_data_end(path: Path) -> int:
    """Where the last tensor ends, from the header: safetensors itself reads lazily and would only fail
    (or read zeros) when the missing tensor is first touched."""
    with path.open("rb") as handle:
        header_size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(header_size))
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    return 8 + header_size + max(ends, default=0)


def check_drafter_matches_verifier(directory: Path, verifier_config, what: str, fix: str) -> None:
    """A drafter proposes token ids the verifier scores: its vocabulary and every embedding / LM head
    it carries must be exactly the verifier's width (a narrower head would crash sampling at T>0,
    a wider one would propose ids the verifier cannot score)."""
    vocab = verifier_config.vocab_size
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DraftlineError(f"{what}: {directory / 'config.json'} is unreadable ({error}); {fix}") from None
    if config.get("vocab_size") != vocab:
        raise DraftlineError(f"{what}: vocab_size {config.get('vocab_size')} differs from the verifier's {vocab}; {fix}")
    # a head over a reduced draft vocabulary (EAGLE-3 `draft_vocab_size`) maps its rows back with d2t
    head_rows = config.get("draft_vocab_size") or vocab
    for name, shape in sorted(safetensors_shapes(directory, fix).items()):
        rows = head_rows if name.endswith("lm_head.weight") else vocab
        if name.endswith(("embed_tokens.weight", "lm_head.weight")) and shape[0] != rows:
            raise DraftlineError(f"{what}: {name} has {shape[0]} rows, expected {rows} (the verifier's vocabulary "
                                 f"has {vocab}); {fix}")


def mask_token_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    if tokenizer.mask_token_id is not None:
        return tokenizer.mask_token_id
    return tokenizer.get_vocab().get(MASK_TOKEN)


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int | None]:
    return {"eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id, "mask": mask_token_id(tokenizer)}


def check_same_tokenizer(verifier_tok: PreTrainedTokenizerBase, drafter_tok: PreTrainedTokenizerBase, what: str) -> None:
    """Drafts are verified token id by token id, so the vocabularies must be identical."""
    if verifier_tok.get_vocab() != drafter_tok.get_vocab():
        raise DraftlineError(
            f"{what}: tokenizer vocabulary differs from the verifier's ({len(drafter_tok)} vs {len(verifier_tok)} "
            "tokens); rebuild it against the current verifier"
        )
    ours, theirs = _special_ids(verifier_tok), _special_ids(drafter_tok)
    if ours != theirs:
        raise DraftlineError(
            f"{what}: special token ids differ from the verifier's ({theirs} vs {ours}); rebuild it against the current verifier"
        )


def require_checkpoint(path: Path, kind: str) -> None:
    """A trained drafter of `kind` at `path`, or one line saying which stage makes it."""
    if not (path / "config.json").exists():
        raise DraftlineError(f"drafter '{kind}' not found at {path}; run `dvc repro train_{kind}` "
                             f"(or remove '{kind}' from the drafters listed in params.yaml)")
