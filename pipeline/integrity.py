"""Artifacts checked before they are loaded: a truncated or edited file is one clear line, not a
loader traceback (or, worse, a model that loads and computes garbage)."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Iterable

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from pipeline.errors import DraftlineError
from pipeline.lineage import PICKLE_SUFFIXES, hash_file, model_identity

MASK_TOKEN = "<|mask|>"  # the block drafter's mask token, when a tokenizer has no mask_token of its own
_CODE_CONFIGS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def verify_manifest(directory: Path, manifest_name: str = "manifest.json") -> None:
    """Every file the export's manifest lists must still have its recorded size and sha256."""
    manifest_path = directory / manifest_name
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DraftlineError(f"{manifest_path} is unreadable ({error}); re-run `dvc repro export`") from None
    for relative, recorded in sorted(files.items()):
        path = directory / relative
        # only regular files inside the export: hashing `/dev/zero` or a FIFO the manifest names would never end
        if not path.resolve().is_relative_to(directory.resolve()):
            raise DraftlineError(f"{manifest_path} lists {relative}, outside {directory}; re-run `dvc repro export`")
        if not path.is_file():
            raise DraftlineError(f"{path} listed in {manifest_path} is missing; re-run `dvc repro export`")
        if path.stat().st_size != recorded["bytes"] or hash_file(path) != recorded["sha256"]:
            raise DraftlineError(
                f"{path} differs from {manifest_path} (truncated or edited after export); re-run `dvc repro export`"
            )


def measured_artifacts(drafter_dir: Path, export_dir: Path) -> dict[str, str | None]:
    """What a metrics file measured, by content: the trained drafter and the export (its manifest, which
    holds every exported file's sha256 and the drafter hash it was exported from). Promotion recomputes
    these and refuses metrics that belong to other artifacts than the ones it registers."""
    manifest = export_dir / "manifest.json"
    return {"drafter_identity": model_identity(drafter_dir) if drafter_dir.is_dir() else None,
            "export_manifest_sha256": hash_file(manifest) if manifest.is_file() else None}


def refuse_special_files(directory: Path, fix: str) -> None:
    """A FIFO, socket or device in a model directory would block (or never end) the first read of it."""
    directory = Path(directory)
    special = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                     if not p.is_file() and not p.is_dir())
    if special:
        raise DraftlineError(f"{directory} holds {', '.join(special)}, which is not a regular file (a FIFO, socket, "
                             f"device or broken link); {fix}")


def refuse_pickled_weights(directory: Path, fix: str) -> None:
    """Pickled weights execute code when unpickled, and from_pretrained may load them instead of the
    *.safetensors that the header checks read."""
    directory = Path(directory)
    pickles = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*")
                     if p.suffix.lower() in PICKLE_SUFFIXES and p.is_file())
    if pickles:
        raise DraftlineError(f"{directory} holds pickled weights ({', '.join(pickles)}), which can run code when "
                             f"loaded; only *.safetensors are loaded: remove them or convert to safetensors; {fix}")


def refused_global(error: pickle.UnpicklingError) -> str:
    """The global a weights-only unpickler refused, from torch's multi-paragraph message."""
    found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
    return found.group(1) if found else "objects a weights-only load refuses"


def check_loadable_dir(directory: Path, fix: str, trust_remote_code: bool = False,
                       allow_pickle_weights: bool = False) -> None:
    """The gate before transformers reads any model or tokenizer directory: no pickles (unless the user's
    params allow them for the verifier: the loader then unpickles weights-only), and no `auto_map` (Python
    files in the directory that transformers would import) unless the user's params trust them."""
    directory = Path(directory)
    refuse_special_files(directory, fix)
    if not allow_pickle_weights:
        refuse_pickled_weights(directory, fix)
    if trust_remote_code:
        return
    for name in _CODE_CONFIGS:
        try:
            config = json.loads((directory / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # absent or unreadable: the loader itself reports it
        if isinstance(config, dict) and config.get("auto_map"):
            raise DraftlineError(f"{directory / name} asks to run the directory's own Python code (auto_map "
                                 f"{json.dumps(config['auto_map'])}) and trust_remote_code is off; {fix}")


def load_pretrained(load, directory: Path, what: str, fix: str, trust_remote_code: bool = False,
                    allow_pickle_weights: bool = False, **kwargs):
    """`load(directory)` (a `from_pretrained`) behind `check_loadable_dir`, local files only, the remote-code
    flag always explicit (never an interactive prompt); loader errors become one line."""
    check_loadable_dir(directory, fix, trust_remote_code, allow_pickle_weights)
    try:
        return load(str(directory), trust_remote_code=trust_remote_code, local_files_only=True, **kwargs)
    except (OSError, ValueError, KeyError, ImportError, TypeError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DraftlineError(f"{what}: cannot load {directory} ({first_line}); {fix}") from None
    except RuntimeError as error:  # transformers' refusal of a tensor whose shape the config does not give
        if "mismatched_sizes" not in str(error) and "size mismatch" not in str(error):
            raise
        raise DraftlineError(f"{what}: a tensor in {directory} has a shape its config.json does not give (size "
                             f"mismatch; transformers' load report names it); {fix}") from None


def load_tokenizer(directory: Path, what: str, fix: str) -> PreTrainedTokenizerBase:
    return load_pretrained(AutoTokenizer.from_pretrained, directory, what, fix)


def safetensors_shapes(directory: Path, fix: str, allow_pickle_weights: bool = False) -> dict[str, list[int]]:
    """Tensor name -> shape from the headers of every `*.safetensors` file (no weights are read); with
    `allow_pickle_weights`, a directory of pickled weights only has none to check."""
    if not allow_pickle_weights:
        refuse_pickled_weights(directory, fix)
    shapes: dict[str, list[int]] = {}
    files = sorted(directory.glob("*.safetensors"))
    if not files and not allow_pickle_weights:
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
    refuse_special_files(directory, fix)  # before reading config.json: a FIFO there would block
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


def stop_token_ids(generation_config, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every id that ends the verifier's text as it is served: its generation_config's eos (an int or a
    list; chat models end turns with an id that is not the tokenizer's eos) and the tokenizer's eos."""
    configured = getattr(generation_config, "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    return sorted({int(i) for i in [*ids, tokenizer.eos_token_id] if i is not None})


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


def non_finite(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors holding NaN or Inf: weights no training should save or export."""
    return [name for name, tensor in tensors
            if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all())]


def refuse_non_finite_weights(directory: Path, what: str, fix: str) -> None:
    """A checkpoint whose safetensors hold NaN/Inf loads and serves garbage without an error: refused, naming
    the tensors (read one at a time, so a big checkpoint is never all in memory)."""
    bad: list[str] = []
    for path in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            bad += non_finite((name, handle.get_tensor(name)) for name in handle.keys())
    if bad:
        shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        raise DraftlineError(f"{what} holds non-finite weights (NaN/Inf in {shown}); {fix}")
