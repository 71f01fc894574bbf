"""Artifacts -> decoding objects: the verifier, the test prompts, and a proposer per drafter kind."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from pipeline.config import EvaluateConfig, VerifierConfig
from pipeline.errors import DraftlineError
from pipeline.integrity import check_drafter_matches_verifier
from pipeline.paths import ArtifactPaths
from serve_eval.decoding import ARProposer, BlockProposer, Proposer
from serve_eval.drafters import BlockDrafter, TorchARDrafter, load_ar_model, load_block_model, require_drafter_dir


def decoding_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_verifier_for_decoding(paths: ArtifactPaths, config: VerifierConfig,
                               ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from data_prep.verifier import load_verifier

    verifier, tokenizer = load_verifier(paths, config.dtype, config.trust_remote_code)
    return verifier.to(decoding_device()), tokenizer


def load_test_prompts(paths: ArtifactPaths, per_domain: int, vocab_size: int | None = None) -> dict[str, list[list[int]]]:
    """The first `per_domain` test prompts of each domain, as token ids (domains in sorted order)."""
    from data_prep.corpus import load_corpus

    test = load_corpus(paths, vocab_size)["test"]
    prompts: dict[str, list[list[int]]] = {}
    for domain, prompt_ids in zip(test["domain"], test["prompt_ids"]):
        chosen = prompts.setdefault(domain, [])
        if len(chosen) < per_domain and prompt_ids:
            chosen.append(list(prompt_ids))
    if not prompts:
        raise DraftlineError(f"the corpus test split at {paths.corpus} has no prompts; "
                             "raise corpus.split.test or corpus.max_prompts_per_domain and rebuild the corpus")
    return dict(sorted(prompts.items()))


def check_drafter(directory: Path, verifier: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, kind: str) -> None:
    """Before any weights load: same tokenizer, vocabulary and head widths as the verifier, intact files."""
    from data_prep.verifier import check_same_tokenizer

    require_drafter_dir(directory, kind)
    what, fix = f"drafter '{kind}' at {directory}", f"retrain it (`dvc repro train_{kind}`)"
    check_drafter_matches_verifier(directory, verifier.config, what, fix)
    check_same_tokenizer(tokenizer, AutoTokenizer.from_pretrained(directory), what)


def onnx_backend():
    """`serve_eval.onnx_backend`, imported only when evaluate.backend is 'onnx'."""
    try:
        from serve_eval import onnx_backend
    except ImportError as error:
        raise DraftlineError(f"the ONNX Runtime backend is unavailable ({error}); set evaluate.backend: torch") from None
    return onnx_backend


def load_proposers(paths: ArtifactPaths, config: EvaluateConfig, verifier: PreTrainedModel,
                   tokenizer: PreTrainedTokenizerBase) -> dict[str, tuple[Proposer, str, PreTrainedModel | None]]:
    """kind -> (proposer, backend name, torch AR model for the HF peer baseline or None)."""
    dtype = verifier.dtype
    proposers: dict[str, tuple[Proposer, str, PreTrainedModel | None]] = {}
    for kind in config.drafters:
        directory = paths.drafter(kind)
        check_drafter(directory, verifier, tokenizer, kind)
        if kind == "ar":
            model = load_ar_model(directory, dtype).to(verifier.device)
            backend = (onnx_backend().load_onnx_ar_drafter(paths.export(kind)) if config.backend == "onnx"
                       else TorchARDrafter(model))
            proposers[kind] = (ARProposer(backend, config.ar_draft_tokens), backend.name, model)
        else:
            model = load_block_model(directory, dtype).to(verifier.device)
            drafter = (onnx_backend().load_onnx_block_drafter(paths.export(kind), config.denoise_steps)
                       if config.backend == "onnx" else BlockDrafter(model, verifier, config.denoise_steps))
            proposers[kind] = (BlockProposer(drafter), config.backend, None)
    return proposers
