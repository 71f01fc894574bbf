"""Muon + AdamW as one optimizer: which parameters Muon gets, that both halves step and resume exactly,
the linear schedule, and the one-line refusal under DeepSpeed."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from pipeline.config.trainer_config import TrainerConfig
from pipeline.training.module import build_optimizer
from pipeline.training.muon import MuonAdamW, is_hidden_matrix


class Drafterish(nn.Module):
    """The block drafter's parameter kinds: hidden matrices, a norm, a bias, heads over the vocabulary."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4, bias=False)
        self.o_proj = nn.Linear(4, 4, bias=True)
        self.norm = nn.LayerNorm(4)
        self.markov_head = nn.Embedding(10, 4)
        self.confidence_head = nn.Linear(4, 1)

    def forward(self, x):
        hidden = self.norm(self.o_proj(self.fc(x)))
        return (hidden @ self.markov_head.weight.T).sum() + self.confidence_head(hidden).sum()


MUON = TrainerConfig(optimizer="muon", learning_rate=1e-2, warmup_steps=0, max_steps=20)


def train(model: nn.Module, optimizer, steps: int, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(3, 6, generator=generator)).backward()
        optimizer.step()


def test_muon_takes_hidden_matrices_only():
    names = {name for name, parameter in Drafterish().named_parameters() if is_hidden_matrix(name, parameter)}
    assert names == {"fc.weight", "o_proj.weight"}


def test_both_halves_step_and_resume_exactly():
    torch.manual_seed(0)
    model = Drafterish()
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    optimizer = build_optimizer(model.named_parameters(), MUON)["optimizer"]
    assert isinstance(optimizer, MuonAdamW)
    train(model, optimizer, 3)
    assert all(not torch.equal(before[name], parameter) for name, parameter in model.named_parameters())
    # resume: a fresh optimizer loading the state continues exactly as the original does
    state, weights = copy.deepcopy(optimizer.state_dict()), {k: v.clone() for k, v in model.state_dict().items()}
    train(model, optimizer, 2, seed=1)
    continued = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(weights)
    resumed = build_optimizer(model.named_parameters(), MUON)["optimizer"]
    resumed.load_state_dict(state)
    train(model, resumed, 2, seed=1)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, continued[name])


def test_schedule_rescales_every_group_and_linear_ends_at_zero():
    cfg = MUON.model_copy(update={"lr_schedule": "linear", "warmup_steps": 2, "max_steps": 10})
    scheduled = build_optimizer(Drafterish().named_parameters(), cfg)
    optimizer, schedule = scheduled["optimizer"], scheduled["lr_scheduler"]["scheduler"]
    for _ in range(10):
        optimizer.step()
        schedule.step()
    assert [group["lr"] for group in optimizer._muon.param_groups + optimizer._adamw.param_groups] == [0.0] * 3


def test_muon_refuses_deepspeed_in_one_line():
    with pytest.raises(ValidationError, match="optimizer 'muon' cannot run under strategy 'deepspeed_stage_2'"):
        TrainerConfig(optimizer="muon", strategy="deepspeed_stage_2")
