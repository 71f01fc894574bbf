"""The AR drafter stage end to end on a tiny verifier + corpus (`tests.support.workspace.make_artifacts`)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.errors import DraftlineError
from pipeline.lineage import model_identity
from tests.support.tiny_models import tiny_qwen3, tiny_tokenizer
from tests.support.training import write_params
from tests.support.workspace import make_artifacts


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
