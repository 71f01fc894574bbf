"""The AR drafter stage end to end on a tiny verifier + corpus built here; helpers shared by test_train_*."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset, DatasetDict
from transformers import AutoModelForCausalLM

from pipeline.config.schema import parse_all
from pipeline.errors import DraftlineError
from pipeline.lineage import model_identity
from pipeline.verifier_record import write_record
from tests.tiny_models import save_tiny_verifier, tiny_qwen3, tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "def add(a, b):", "class Stack:", "import os", "for i in range(10):", "The quick brown fox",
    "Speculative decoding drafts", "def push(self, item):", "print(i)", "return a + b", "jumps over the lazy dog",
    "self.items.append", "import sys", "a small model", "verifies them in one pass", "class Queue:", "def pop(self):",
]


def make_artifacts(root: Path, *, rows_per_split: tuple[int, int, int] = (12, 4, 2), new_tokens: int = 12) -> Path:
    """`root/artifacts/{verifier,corpus}` in the contract layouts; responses are the verifier's greedy outputs."""
    artifacts = root / "artifacts"
    verifier_dir = artifacts / "verifier"
    model, tokenizer = save_tiny_verifier(verifier_dir, num_layers=2)
    write_record(verifier_dir, source="bootstrap", name_or_path=str(verifier_dir), id_prefix="tiny-test")
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
    return artifacts


def write_params(root: Path, trainer: dict, ar: dict | None = None) -> Path:
    """A params.yaml pointing every output under `root`, with tiny AR drafter settings."""
    data = {
        "project": {"artifacts_dir": str(root / "artifacts"), "metrics_dir": str(root / "metrics"),
                    "plots_dir": str(root / "plots")},
        "train": {"ar": {"num_layers": 1, "num_heads": 4, "num_kv_heads": 2,
                         "loss": {"fkl": 1.0, "ce": 0.1},
                         "trainer": {"batch_size": 4, "learning_rate": 0.01, "warmup_steps": 2, "max_seq_len": 32,
                                     "val_every_n_steps": 1000, **trainer},
                         **(ar or {})}},
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}"},
    }
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    parse_all(data)  # fail here, not in a subprocess, on a bad test config
    return path


def run_train(params_path: Path, timeout: float = 170) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MLFLOW_ENABLE_TELEMETRY": "false"}
    return subprocess.run(
        [sys.executable, "-m", "train.dispatch", "--drafter", "ar", "--params", str(params_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )


def assert_trained(root: Path, result: subprocess.CompletedProcess, steps: int) -> dict:
    assert result.returncode == 0, result.stderr[-4000:]
    drafter_dir = root / "artifacts" / "drafters" / "ar"
    info = json.loads((drafter_dir / "training.json").read_text())
    assert info["steps"] == steps
    assert info["val_loss"] < info["untrained_val_loss"], info
    assert info["lineage"]["verifier_id"].startswith("tiny-test-")
    model = AutoModelForCausalLM.from_pretrained(drafter_dir)
    assert model.config.num_hidden_layers == 1
    assert (drafter_dir / "tokenizer.json").is_file()
    return info


def test_train_ar_auto_in_process(tmp_path):
    from pipeline.config.schema import load_all
    from train.dispatch import train

    make_artifacts(tmp_path)
    params = load_all(write_params(tmp_path, {"max_steps": 30, "checkpoint_every_n_steps": 10}))
    info = train(params, "ar")
    assert info["steps"] == 30
    assert info["val_loss"] < info["untrained_val_loss"]
    assert len(info["top1_agreement"]) == params.train.ar.draft_tokens
    metrics = json.loads((tmp_path / "metrics" / "train_ar.json").read_text())
    assert metrics["steps"] == 30
    drafter_dir = tmp_path / "artifacts" / "drafters" / "ar"
    AutoModelForCausalLM.from_pretrained(drafter_dir)
    # the environment that trained it: in training.json and on the MLflow run, which the checkpoint's
    # identity finds (training.json names no run id: its bytes depend on the training alone)
    assert info["lineage"]["library_versions"]["torch"] == torch.__version__
    assert "mlflow_run_id" not in json.loads((drafter_dir / "training.json").read_text())
    from pipeline.promote.model_registry import Registry

    registry = Registry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = registry.find_training_run(registry.experiment_id(params.tracking.experiment), model_identity(drafter_dir))
    assert run is not None and run.data.tags["draftline.kind"] == "ar"
    assert run.data.tags["library.torch"] == torch.__version__ and run.data.tags["library.lightning"]


def test_pretrained_init_with_other_vocabulary_is_refused(tmp_path):
    from pipeline.config.schema import load_all
    from train.dispatch import train

    make_artifacts(tmp_path, rows_per_split=(2, 1, 1), new_tokens=4)
    other_tokenizer = tiny_tokenizer(vocab_size=300)
    other = tiny_qwen3(len(other_tokenizer), num_layers=1)
    other_dir = tmp_path / "other"
    other.save_pretrained(other_dir)
    other_tokenizer.save_pretrained(other_dir)
    params = load_all(write_params(tmp_path, {"max_steps": 1}, {"init": "pretrained", "init_path": str(other_dir)}))
    with pytest.raises(DraftlineError, match="differs from the verifier"):
        train(params, "ar")
    assert not (tmp_path / "artifacts" / "drafters" / "ar").exists()


def test_epochs_budget_follows_the_corpus():
    from pipeline.config.trainer_config import TrainerConfig
    from pipeline.training.budget import resolve_budget

    assert resolve_budget(TrainerConfig(max_steps=77), 1000).max_steps == 77
    per_epoch = TrainerConfig(max_steps=77, epochs=2, batch_size=16, accumulate_grad_batches=2)
    assert resolve_budget(per_epoch, 100).max_steps == 7  # ceil(100 / 16) = 7 batches, x2 epochs, / 2 accumulated
    assert resolve_budget(per_epoch.model_copy(update={"devices": 2}), 100).max_steps == 4
