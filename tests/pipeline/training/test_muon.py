"""Muon + AdamW as one optimizer: which parameters Muon gets, that both halves step and resume exactly,
the linear schedule, the one-line refusal under DeepSpeed, and Newton-Schulz's dtype (forced, or probed)."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from pipeline.config.trainer_config import TrainerConfig
from pipeline.machine import MatmulProbe
from pipeline.training.module import build_optimizer
from pipeline.training.muon import MuonAdamW, PrecisionMuon, is_hidden_matrix, newton_schulz


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


def test_bfloat16_path_steps_exactly_as_torchs_muon():
    """PrecisionMuon is torch's Muon step with the dtype made a choice: in bfloat16 the two agree bit for bit."""
    torch.manual_seed(0)
    ours, theirs = Drafterish(), Drafterish()
    theirs.load_state_dict(ours.state_dict())
    kwargs = {"lr": 1e-2, "weight_decay": 0.01, "adjust_lr_fn": "match_rms_adamw"}
    train(ours, PrecisionMuon([ours.fc.weight, ours.o_proj.weight], torch.bfloat16, **kwargs), 3)
    train(theirs, torch.optim.Muon([theirs.fc.weight, theirs.o_proj.weight], **kwargs), 3)
    for name, value in ours.state_dict().items():
        assert torch.equal(value, theirs.state_dict()[name]), name


# bfloat16 keeps 8 significant bits: five Newton-Schulz rounds in it land 1.2-1.5% (relative Frobenius
# norm) from the float32 iteration's orthogonalized update at these and the demo's shapes
NEWTON_SCHULZ_BF16_TOLERANCE = 0.02


@pytest.mark.parametrize("shape", [(64, 160), (160, 64), (128, 128)])
def test_float32_and_bfloat16_give_the_same_orthogonalized_update(shape):
    update = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    args = ((3.4445, -4.7750, 2.0315), 5, 1e-7)
    fp32, bf16 = (newton_schulz(update, *args, dtype) for dtype in (torch.float32, torch.bfloat16))
    assert fp32.dtype == torch.float32 and fp32.shape == shape
    assert (fp32 - bf16.float()).norm() / fp32.norm() < NEWTON_SCHULZ_BF16_TOLERANCE


@pytest.mark.parametrize("forced", ["bfloat16", "float32"])
def test_a_forced_precision_is_used_without_probing(forced, monkeypatch):
    monkeypatch.setattr("pipeline.training.muon.probe_matmul", lambda *_: pytest.fail("probed"))
    optimizer = build_optimizer(Drafterish().named_parameters(),
                                MUON.model_copy(update={"muon_precision": forced}))["optimizer"]
    assert optimizer.precision == getattr(torch, forced) == optimizer._muon.dtype


@pytest.mark.parametrize(("bf16_s", "chosen"), [(0.5, torch.bfloat16), (2.0, torch.float32)])
def test_auto_takes_bfloat16_only_where_the_probe_finds_it_faster(bf16_s, chosen, monkeypatch):
    asked = []

    def probe(rows, cols, device):
        asked.append((rows, cols, device.type))
        return MatmulProbe(fp32_s=1.0, bf16_s=bf16_s)

    monkeypatch.setattr("pipeline.training.muon.probe_matmul", probe)
    optimizer = build_optimizer(Drafterish().named_parameters(), MUON)["optimizer"]
    assert optimizer.precision == chosen
    assert asked == [(4, 6, "cpu")]  # the largest Muon matrix, fc (4 x 6), sorted short side first
