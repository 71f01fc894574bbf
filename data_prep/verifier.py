"""Load the verifier recorded by `bootstrap_verifier`, and compare tokenizers against it.

`artifacts/verifier/verifier.json` says where the model is: the directory itself (bootstrap) or an
external local path / cached HF name (source `hf`). Nothing downstream needs to know which.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from pipeline.atomic import write_json_atomic
from pipeline.errors import DraftlineError
from pipeline.integrity import check_loadable_dir, refused_global, safetensors_shapes
from pipeline.lineage import library_versions, model_identity
from pipeline.paths import ArtifactPaths

RECORD_NAME = "verifier.json"
_MISSING_HINT = "run `dvc repro bootstrap_verifier` (or `draftline bootstrap_verifier`)"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_record(paths: ArtifactPaths) -> dict:
    record_path = paths.verifier / RECORD_NAME
    if not record_path.is_file():
        raise DraftlineError(f"no verifier at {paths.verifier} ({RECORD_NAME} missing); {_MISSING_HINT}")
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DraftlineError(f"{record_path} is not valid JSON ({error}); {_MISSING_HINT}") from None
    if not isinstance(record, dict) or not {"source", "name_or_path", "hash", "id"} <= record.keys():
        raise DraftlineError(f"{record_path} lacks source/name_or_path/hash/id; {_MISSING_HINT}")
    return record


def write_record(directory: Path, *, source: str, name_or_path: str, id_prefix: str,
                 trust_remote_code: bool = False, model_dir: Path | None = None) -> dict:
    """Write `verifier.json` into `directory`; the hash is the model identity of `model_dir` (default:
    `directory` itself), so the id, and the registered model names built from it, survive a library
    upgrade that only re-stamps the checkpoint's files.

    Tests use it too: a checkpoint saved into `artifacts/verifier/` plus this record is a verifier.
    """
    content_hash = model_identity(model_dir or directory)
    record = {"source": source, "name_or_path": name_or_path, "hash": content_hash,
              "id": f"{id_prefix}-{content_hash[:12]}", "trust_remote_code": trust_remote_code,
              "library_versions": library_versions()}
    write_json_atomic(Path(directory) / RECORD_NAME, record)
    return record


def verifier_identity(paths: ArtifactPaths) -> dict:
    """The verifier's id and hash, the hash recomputed from its files now. `verifier.json` is a file anyone
    can edit and, for an external verifier, the model lives outside what DVC tracks: training fingerprints,
    corpus shards, exports, metrics and registered model names all bind to this identity, so it must be
    the identity of the weights that are actually there."""
    record = read_record(paths)
    record_path = paths.verifier / RECORD_NAME
    location = Path(model_location(paths, record))
    if record["source"] == "bootstrap":
        fix = "restore it (`dvc checkout bootstrap_verifier`) or rebuild it (`dvc repro bootstrap_verifier`)"
    else:  # DVC does not track the external model's files, so only a forced run re-records it
        fix = "re-record it with `dvc repro -f bootstrap_verifier` (or `draftline bootstrap_verifier`)"
    if not (location / "config.json").is_file():  # never hash whatever tree the record points at ("/")
        raise DraftlineError(f"the verifier recorded in {record_path} is not at {location} (no config.json); {fix}")
    try:
        now = model_identity(location)
    except OSError as error:
        raise DraftlineError(f"cannot read the verifier at {location} ({error}); {fix}") from None
    if now != record["hash"]:
        raise DraftlineError(f"the verifier at {location} is not the one {record_path} recorded (its files hash to "
                             f"{now[:12]}, recorded {str(record['hash'])[:12]}); {fix}")
    if not str(record["id"]).endswith(f"-{now[:12]}"):  # registered model names are built from the id
        raise DraftlineError(f"{record_path}: id '{record['id']}' is not one bootstrap_verifier gives the verifier "
                             f"with hash {now[:12]}; {fix}")
    return {"id": record["id"], "hash": now, "source": record["source"]}


def model_location(paths: ArtifactPaths, record: dict) -> str:
    """The directory (or cached HF name) to load: the verifier dir itself for a bootstrapped model."""
    return str(paths.verifier) if record["source"] == "bootstrap" else record["name_or_path"]


def load_model_and_tokenizer(
    location: str, dtype: str = "float32", trust_remote_code: bool = False, allow_pickle_weights: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Local files only; safetensors only unless `allow_pickle_weights` (then pickled weights are unpickled
    weights-only: tensors, never code); the model comes back frozen in eval mode."""
    transformers_logging.disable_progress_bar()  # weight-loading bars would drown the stage's own
    if Path(location).is_dir():  # a truncated weights file is one line here, not a loader traceback
        fix = "restore the verifier's files (or re-run `dvc repro bootstrap_verifier`)"
        check_loadable_dir(Path(location), fix, trust_remote_code, allow_pickle_weights)
        safetensors_shapes(Path(location), fix, allow_pickle_weights)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location, dtype=_DTYPES[dtype], use_safetensors=None if allow_pickle_weights else True,
            weights_only=True, trust_remote_code=trust_remote_code, local_files_only=True,
        )
        tokenizer = AutoTokenizer.from_pretrained(
            location, trust_remote_code=trust_remote_code, local_files_only=True
        )
    except pickle.UnpicklingError as error:
        raise DraftlineError(
            f"verifier '{location}': its pickled weights hold objects that are not tensors ({refused_global(error)}), "
            "which could run code when loaded, so they are refused even with verifier.allow_pickle_weights; "
            "convert them to safetensors"
        ) from None
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as error:
        # RuntimeError: torch's reader on a truncated pickled checkpoint (allow_pickle_weights)
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DraftlineError(
            f"cannot load verifier '{location}' as a causal LM with "
            f"{'its' if allow_pickle_weights else 'safetensors'} weights ({first_line}); "
            "check verifier.name_or_path (a local dir or a model in the local HF cache)"
        ) from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def load_verifier(paths: ArtifactPaths, dtype: str = "float32", trust_remote_code: bool = False,
                  allow_pickle_weights: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`trust_remote_code` comes from params only: the flag recorded in the artifact is informational,
    so editing a file under artifacts/ can never switch on running a model's own code."""
    record = read_record(paths)
    location = model_location(paths, record)
    if record["source"] == "bootstrap" and not (paths.verifier / "config.json").is_file():
        raise DraftlineError(f"{paths.verifier} has {RECORD_NAME} but no checkpoint; {_MISSING_HINT}")
    return load_model_and_tokenizer(location, dtype, trust_remote_code, allow_pickle_weights)
