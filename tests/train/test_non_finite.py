"""A non-finite loss, gradient or weight stops training with one line naming what, where and which step, and no
checkpoint, drafter or export holds it (damaged features trained a drafter saved with NaN weights, exit 0)."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from lightning.pytorch import LightningModule
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from export import export
from pipeline.config.trainer_config import TrainerConfig
from tests.support.workspace import tiny_workspace
from train.trainer import NonFiniteTraining, build_trainer

STEPS = 4


class Regression(LightningModule):
    """y = w.x; at `bad_step` the loss is multiplied by `factor` (NaN: NaN gradients) or has `offset` added (a
    constant: an Inf loss with finite gradients); `lr` NaN makes the weights NaN with finite gradients."""

    def __init__(self, bad_step: int = 0, factor: float = 1.0, offset: float = 0.0, lr: float = 0.1):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.bad_step, self.factor, self.offset, self.lr = bad_step, factor, offset, lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.global_step + 1 == self.bad_step:
            loss = loss * self.factor + self.offset
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(32, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def _fit(tmp_path, module: Regression) -> str:
    cfg = TrainerConfig(accelerator="cpu", max_steps=STEPS, checkpoint_every_n_steps=1, val_every_n_steps=1000,
                        warmup_steps=0)
    trainer = build_trainer(cfg, checkpoint_dir=tmp_path, enable_progress_bar=False, limit_val_batches=0,
                            stage="train.test")
    with pytest.raises(NonFiniteTraining) as info:
        trainer.fit(module)
    message = str(info.value)
    assert "\n" not in message and message.startswith("train.test: ")
    return message


def _checkpointed_steps(tmp_path) -> list[int]:
    return sorted(torch.load(path, weights_only=True)["global_step"] for path in tmp_path.glob("*.ckpt"))


def test_a_nan_gradient_stops_before_it_is_applied(tmp_path):
    module = Regression(bad_step=3, factor=math.nan)
    message = _fit(tmp_path, module)
    assert "the gradient of layer." in message and "at optimizer step 3, before it was applied" in message
    assert all(torch.isfinite(parameter).all() for parameter in module.parameters())
    assert max(_checkpointed_steps(tmp_path)) == 2


def test_an_infinite_loss_stops_the_run(tmp_path):
    message = _fit(tmp_path, Regression(bad_step=2, offset=math.inf))
    assert "the training loss is inf at batch 1 of epoch 0" in message
    assert max(_checkpointed_steps(tmp_path)) == 1  # the step that produced it is never checkpointed


def test_a_checkpoint_with_nan_weights_is_never_written(tmp_path):
    message = _fit(tmp_path, Regression(lr=math.nan))  # finite loss and gradients, NaN weights after step 1
    assert "the weights at step 1 hold NaN/Inf (layer.weight, layer.bias), so the checkpoint was not written" in message
    assert _checkpointed_steps(tmp_path) == []


def test_export_refuses_a_checkpoint_with_non_finite_weights(tmp_path, capsys):
    tiny_workspace(tmp_path)
    weights = tmp_path / "artifacts" / "drafters" / "ar" / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[-1]
    tensors[name] = torch.full_like(tensors[name], math.nan)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"project": {"artifacts_dir": str(tmp_path / "artifacts")},
                                      "export": {"kinds": ["ar"], "tensorrt": "off"}}))
    capsys.readouterr()
    assert export.main(["--params", str(params)]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress lines
    assert error.startswith("draftline: error: ") and f"holds non-finite weights (NaN/Inf in {name}); retrain it" in error
    assert not (tmp_path / "artifacts" / "export" / "ar").exists()
