"""Training knobs far past any sensible value are refused with the reason, not trained into garbage
(`train.block.feature_noise: 1e30` was accepted and trained a drafter no better than untrained)."""

from __future__ import annotations

import pytest

from pipeline.config.schema import parse_all
from pipeline.errors import ParamsError


def _nested(path: str, value) -> dict:
    data: dict = {}
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


@pytest.mark.parametrize("path, value, reason", [
    ("train.block.feature_noise", 1e30, "drowns the verifier's hidden states"),
    ("train.ar.loss.temperature", 1e6, "nearly uniform"),
    ("train.block.loss.temperature", 50.0, "nearly uniform"),
    ("train.eagle3.loss.temperature", 11.0, "nearly uniform"),
    ("train.eagle3.trainer.weight_decay", 1e3, "the decay, not the loss, sets the weights"),
])
def test_a_knob_past_its_bound_is_one_line_with_the_reason(path, value, reason):
    with pytest.raises(ParamsError) as info:
        parse_all(_nested(path, value))
    message = str(info.value)
    assert "\n" not in message and f"{path}: at most" in message and reason in message


@pytest.mark.parametrize("path, value", [
    ("train.block.feature_noise", 0.05), ("train.ar.loss.temperature", 2.0), ("train.ar.trainer.weight_decay", 0.1),
])
def test_sensible_values_stay_accepted(path, value):
    parse_all(_nested(path, value))
