"""Tiny workspaces on disk, in the layouts the stages read: a tiny verifier with its record, a corpus, and a
tiny drafter of every registered kind (`TINY_DRAFTERS`, looped over `KINDS`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from datasets import Dataset, DatasetDict

from pipeline.drafters.kinds import KINDS
from pipeline.verifier_record import write_record
from tests.support.decoding import block_model
from tests.support.features import write_features
from tests.support.tiny_models import save_tiny_eagle3, save_tiny_verifier, tiny_qwen3

PROMPTS = [
    "def add(a, b):", "class Stack:", "import os", "for i in range(10):", "The quick brown fox",
    "Speculative decoding drafts", "def push(self, item):", "print(i)", "return a + b", "jumps over the lazy dog",
    "self.items.append", "import sys", "a small model", "verifies them in one pass", "class Queue:", "def pop(self):",
]


def write_verifier(directory: Path, id_prefix: str, **config):
    """A tiny verifier checkpoint and its record, as `bootstrap_verifier` leaves them; returns (model, tokenizer)."""
    model, tokenizer = save_tiny_verifier(directory, **config)
    write_record(directory, source="bootstrap", name_or_path=str(directory), id_prefix=id_prefix)
    return model, tokenizer


def make_artifacts(root: Path, *, rows_per_split: tuple[int, int, int] = (12, 4, 2), new_tokens: int = 12) -> Path:
    """`root/artifacts/{verifier,corpus,features}` for training: a 2-layer verifier, a corpus whose responses are
    its greedy outputs, and its fp32 features over that corpus (`tests.support.features`)."""
    artifacts = root / "artifacts"
    model, tokenizer = write_verifier(artifacts / "verifier", "tiny-test", num_layers=2)
    splits, start = {}, 0
    for name, count in zip(("train", "validation", "test"), rows_per_split):
        rows = []
        for index in range(start, start + count):
            # validation/test reuse training prompts so that "loss decreases" is certain on this tiny data;
            # held-out generalisation is measured on the demo corpus, not here
            prompt = PROMPTS[index % rows_per_split[0]]
            prompt_ids = tokenizer(prompt)["input_ids"]
            with torch.no_grad():
                out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id, eos_token_id=None)
            rows.append({"id": f"row{index}", "domain": "code" if index % 2 else "text", "source": "test",
                         "prompt": prompt, "prompt_ids": prompt_ids, "response_ids": out[0, len(prompt_ids):].tolist(),
                         "finish_reason": "length", "temperature": 0.0, "seed": 0})
        splits[name] = Dataset.from_list(rows)
        start += count
    DatasetDict(splits).save_to_disk(str(artifacts / "corpus"))
    write_features(artifacts)  # training reads them: every kind trains offline by default
    return artifacts


def corpus_rows(tokenizer, count: int) -> Dataset:
    """`count` rows per domain (code, text); each response is its prompt's first 4 tokens."""
    texts = {"code": "def add(a, b):\n    return a + b\n", "text": "The quick brown fox jumps over the"}
    rows = []
    for i in range(count):
        for domain, text in texts.items():
            ids = tokenizer(text + " " * i)["input_ids"]
            rows.append({"id": f"{domain}-{i}", "domain": domain, "source": "test", "prompt": text,
                         "prompt_ids": ids, "response_ids": ids[:4], "finish_reason": "length",
                         "temperature": 0.0, "seed": 0})
    return Dataset.from_list(rows)


def save_ar(verifier, tokenizer, directory: Path) -> None:
    drafter = tiny_qwen3(len(tokenizer), num_layers=1, seed=5, eos_token_id=tokenizer.eos_token_id)
    drafter.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "training.json").write_text(json.dumps({"kind": "ar", "draft_tokens": 4}))


def save_block(verifier, tokenizer, directory: Path) -> None:
    block_model(verifier, 4).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def save_dspark(verifier, tokenizer, directory: Path) -> None:
    block_model(verifier, 4, markov_rank=4, confidence=True).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def save_eagle3(verifier, tokenizer, directory: Path) -> None:
    save_tiny_eagle3(verifier, tokenizer, directory, draft_tokens=3, draft_vocab_size=200)


TINY_DRAFTERS = {"ar": save_ar, "block": save_block, "dspark": save_dspark, "eagle3": save_eagle3}
"""How to save a tiny drafter of each kind; a registered kind missing here fails `tiny_workspace` by name."""


def tiny_workspace(root: Path) -> Path:
    """`root/artifacts/`: verifier, a two-domain corpus (the same rows in every split) and one tiny drafter of
    every registered kind, untrained: what export, evaluate and serve_check read."""
    artifacts = root / "artifacts"
    verifier, tokenizer = write_verifier(artifacts / "verifier", "test")
    split = corpus_rows(tokenizer, 2)
    DatasetDict(train=split, validation=split, test=split).save_to_disk(str(artifacts / "corpus"))
    for name in KINDS:
        TINY_DRAFTERS[name](verifier, tokenizer, artifacts / "drafters" / name)
    return root


def evaluate_params(root: Path, **evaluate) -> str:
    """A params.yaml in `root` with small `evaluate` settings (paths: the defaults, under the cwd)."""
    settings = {"prompts_per_domain": 2, "max_new_tokens": 6, "temperatures": [0.0, 0.8], **evaluate}
    (root / "params.yaml").write_text(json.dumps({"evaluate": settings}))
    return str(root / "params.yaml")
