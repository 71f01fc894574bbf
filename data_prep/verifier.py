"""Load the verifier recorded by `bootstrap_verifier` (its record: `pipeline/verifier_record.py`).

The record says where the model is: the directory itself (bootstrap) or an external local path /
cached HF name (source `hf`). Nothing downstream needs to know which.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from pipeline.errors import DraftlineError
from pipeline.integrity import check_loadable_dir, refused_global, safetensors_shapes
from pipeline.paths import ArtifactPaths
from pipeline.verifier_record import MISSING_HINT, RECORD_NAME, model_location, read_record

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model_and_tokenizer(
    location: str, dtype: str = "float32", trust_remote_code: bool = False, allow_pickle_weights: bool = False,
    device_map: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Local files only; safetensors only unless `allow_pickle_weights` (then pickled weights are unpickled
    weights-only: tensors, never code); the model comes back frozen in eval mode, on the CPU unless
    `device_map` places it (transformers' `device_map`: "auto" spreads it over every GPU)."""
    transformers_logging.disable_progress_bar()  # weight-loading bars would drown the stage's own
    if Path(location).is_dir():  # a truncated weights file is one line here, not a loader traceback
        fix = "restore the verifier's files (or re-run `dvc repro bootstrap_verifier`)"
        check_loadable_dir(Path(location), fix, trust_remote_code, allow_pickle_weights)
        safetensors_shapes(Path(location), fix, allow_pickle_weights)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location, dtype=_DTYPES[dtype], use_safetensors=None if allow_pickle_weights else True,
            weights_only=True, trust_remote_code=trust_remote_code, local_files_only=True, device_map=device_map,
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
        raise DraftlineError(f"{paths.verifier} has {RECORD_NAME} but no checkpoint; {MISSING_HINT}")
    return load_model_and_tokenizer(location, dtype, trust_remote_code, allow_pickle_weights)
