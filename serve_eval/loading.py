"""Artifacts -> decoding objects: the verifier, the test prompts, and each drafter on its backend."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.config.evaluate_config import EvaluateConfig
from pipeline.config.verifier_config import VerifierConfig
from pipeline.drafters.interface import LoadedDrafter
from pipeline.drafters.kinds import KINDS
from pipeline.errors import DraftlineError
from pipeline.integrity import check_drafter_matches_verifier, check_same_tokenizer, load_tokenizer, require_checkpoint
from pipeline.paths import ArtifactPaths


def decoding_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_verifier_for_decoding(paths: ArtifactPaths, config: VerifierConfig,
                               ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from data_prep.verifier import load_verifier

    verifier, tokenizer = load_verifier(paths, config.dtype, config.trust_remote_code, config.allow_pickle_weights)
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


def held_out_prompts(corpus, vocab_size: int | None) -> dict[str, list[list[int]]]:
    """Every prompt of the test and validation splits, by domain (sorted); with `vocab_size`, those within it."""
    prompts: dict[str, list[list[int]]] = {}
    for split in ("test", "validation"):
        for domain, prompt_ids in zip(corpus[split]["domain"], corpus[split]["prompt_ids"]):
            if prompt_ids and (vocab_size is None or max(prompt_ids) < vocab_size):
                prompts.setdefault(domain, []).append(list(prompt_ids))
    if not prompts:
        raise DraftlineError("the corpus has no test or validation prompts to decode; rebuild it")
    return dict(sorted(prompts.items()))


def check_drafter(directory: Path, verifier: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, kind: str) -> None:
    """Before any weights load: same tokenizer, vocabulary and head widths as the verifier, intact files."""
    require_checkpoint(directory, kind)
    what, fix = f"drafter '{kind}' at {directory}", f"retrain it (`dvc repro train_{kind}`)"
    check_drafter_matches_verifier(directory, verifier.config, what, fix)
    check_same_tokenizer(tokenizer, load_tokenizer(directory, what, fix), what)


def load_drafters(paths: ArtifactPaths, config: EvaluateConfig, verifier: PreTrainedModel,
                  tokenizer: PreTrainedTokenizerBase) -> dict[str, LoadedDrafter]:
    """Each drafter of `config.drafters`, checked against the verifier, on `config.backend`."""
    loaded = {}
    for name in config.drafters:
        check_drafter(paths.drafter(name), verifier, tokenizer, name)
        loaded[name] = KINDS[name].load(paths.drafter(name), verifier, config, paths.export(name))
    return loaded
