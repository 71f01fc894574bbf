"""Each loss against a value computed by hand on tiny tensors; masked positions never matter."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.config.trainer_config import LossConfig, TrainerConfig
from pipeline.training import distillation as losses
from pipeline.training.agreement import AgreementCounts, simulated_acceptance_length
from pipeline.training.module import build_optimizer

# One batch, two positions, vocabulary of 2. Position 0 is a response token; position 1 is masked.
P = [0.8, 0.2]  # teacher at position 0
Q = [0.5, 0.5]  # student at position 0
MASK = torch.tensor([[True, False]])


def _logits(first: list[float], second: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor([[first, second]]))


def teacher(second=(0.3, 0.7)) -> torch.Tensor:
    return _logits(P, list(second))


def student(second=(0.9, 0.1)) -> torch.Tensor:
    return _logits(Q, list(second))


def kl(a, b) -> float:
    return sum(x * math.log(x / y) for x, y in zip(a, b))


def test_fkl_is_kl_teacher_student():
    assert losses.fkl(student(), teacher(), MASK).item() == pytest.approx(kl(P, Q), rel=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_forward_kl_per_position_equals_kl_and_its_gradient(temperature):
    """The fused form (soft-target CE less the teacher's entropy) gives KL(p || q) and KL's gradient."""
    torch.manual_seed(0)
    teacher_logits = torch.randn(3, 4, 9) * 3
    teacher_logits[0, 0, :4] = -float("inf")  # zero teacher probabilities: 0·log 0 = 0
    student_a, student_b = (torch.randn(3, 4, 9).requires_grad_() for _ in range(2))
    with torch.no_grad():
        student_b.copy_(student_a)
    fused = losses.forward_kl_per_position(student_a, teacher_logits, temperature)
    plain = losses.kl_per_position(losses.log_probs(teacher_logits, temperature), losses.log_probs(student_b, temperature))
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    (fused * torch.arange(4.0)).sum().backward()
    (plain * torch.arange(4.0)).sum().backward()
    torch.testing.assert_close(student_a.grad, student_b.grad, rtol=1e-5, atol=1e-6)


def test_rkl_is_kl_student_teacher():
    assert losses.rkl(student(), teacher(), MASK).item() == pytest.approx(kl(Q, P), rel=1e-5)


def test_tvd_is_half_l1():
    assert losses.tvd(student(), teacher(), MASK).item() == pytest.approx(0.3, rel=1e-5)


def test_jsd_by_hand():
    m = [(p + q) / 2 for p, q in zip(P, Q)]
    expected = 0.5 * kl(P, m) + 0.5 * kl(Q, m)
    assert losses.jsd(student(), teacher(), MASK).item() == pytest.approx(expected, rel=1e-5)


def test_ce_on_response_tokens():
    labels = torch.tensor([[1, 0]])
    assert losses.ce(student(), labels, MASK).item() == pytest.approx(-math.log(0.5), rel=1e-5)


def test_temperature_softens_both_sides():
    temperature = 2.0

    def soft(dist):
        return [x ** (1 / temperature) / sum(y ** (1 / temperature) for y in dist) for x in dist]

    value = losses.fkl(student(), teacher(), MASK, temperature=temperature).item()
    assert value == pytest.approx(kl(soft(P), soft(Q)), rel=1e-5)


@pytest.mark.parametrize("name", ["fkl", "rkl", "tvd", "jsd"])
def test_masked_positions_do_not_change_divergences(name):
    fn = getattr(losses, name)
    base = fn(student(), teacher(), MASK)
    other = fn(student((0.01, 0.99)), teacher((0.999, 0.001)), MASK)
    assert base.item() == pytest.approx(other.item(), abs=1e-7)
    garbage = student().clone()
    garbage[0, 1] = torch.tensor([float("inf"), float("nan")])
    assert fn(garbage, teacher(), MASK).item() == pytest.approx(base.item(), abs=1e-7)


def test_masked_positions_do_not_change_ce():
    labels = torch.tensor([[1, 0]])
    base = losses.ce(student(), labels, MASK)
    assert losses.ce(student((0.01, 0.99)), torch.tensor([[1, 1]]), MASK).item() == pytest.approx(base.item())


def test_mixture_weights_terms():
    cfg = LossConfig(ce=0.5, fkl=2.0, tvd=1.0)
    labels = torch.tensor([[1, 0]])
    total, terms = losses.mixture(cfg, student(), MASK, labels=labels, teacher_logits=teacher())
    assert set(terms) == {"ce", "fkl", "tvd"}
    assert total.item() == pytest.approx(0.5 * -math.log(0.5) + 2.0 * kl(P, Q) + 1.0 * 0.3, rel=1e-5)


def test_mixture_without_teacher_for_divergence_fails():
    with pytest.raises(ValueError, match="verifier"):
        losses.mixture(LossConfig(fkl=1.0), student(), MASK, labels=torch.tensor([[1, 0]]))


def test_gradient_flows_only_through_the_student():
    logits = student().requires_grad_(True)
    losses.fkl(logits, teacher(), MASK).backward()
    assert logits.grad[0, 0].abs().sum() > 0
    assert logits.grad[0, 1].abs().sum() == 0


def test_acceptance_windows_and_length():
    # one row, 5 valid prediction positions; matches: T T F T T
    match = torch.tensor([[True, True, False, True, True]])
    valid = torch.ones_like(match)
    tally = AgreementCounts(3)
    tally.add_windows(match, valid)
    # position 1: starts 0..4, hits at 0,1,3,4 -> 4/5
    # position 2: alive starts 0,1,3,4 with s+1 valid: 0,1,3 -> hits where match[s+1]: 0 (1 ok), 1 (2 F), 3 (4 ok) -> 2/3
    # position 3: alive 0,3 with s+2 valid: 0 only (3+2=5 out) -> match[2] F -> 0/1
    assert tally.rates() == pytest.approx([4 / 5, 2 / 3, 0.0])
    assert simulated_acceptance_length(tally.rates()) == pytest.approx(4 / 5 + 4 / 5 * 2 / 3)


def test_drafter_schedule_warms_up_then_decays_to_a_tenth():
    cfg = TrainerConfig(warmup_steps=10, max_steps=100, learning_rate=1e-3)
    scheduled = build_optimizer([("w", torch.nn.Parameter(torch.zeros(2, 2)))], cfg)
    optimizer, schedule = scheduled["optimizer"], scheduled["lr_scheduler"]["scheduler"]
    rates = []
    for _ in range(101):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[10] == pytest.approx(1e-3) and rates[100] == pytest.approx(1e-4)
    assert rates[:11] == sorted(rates[:11]) and rates[10:] == sorted(rates[10:], reverse=True)
