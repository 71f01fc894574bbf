"""`evaluate`: the speculative decoding evaluation of stage `evaluate`."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, StrictBool, field_validator

from pipeline.config.base import DRAFTER_NAMES, DrafterName, Seed
from pipeline.config.section import Section, unique


def temperature_key(temperature: float) -> str:
    """How a temperature names its results in `metrics/eval.json` (`by_temperature["0.8"]`) and the gate's metrics."""
    return str(float(temperature))


class EvaluateConfig(Section):
    drafters: list[DrafterName] = Field(default_factory=lambda: list(DRAFTER_NAMES), min_length=1)
    prompts_per_domain: int = Field(12, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    temperatures: list[float] = Field(default_factory=lambda: [0.0, 0.8], min_length=1)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    denoise_steps: int = Field(1, ge=1)
    confidence_threshold: float = Field(
        0.0, ge=0.0, lt=1.0, description="block drafters with a confidence head: stop drafting a block once the "
        "product of its positions' predicted acceptance falls below this (0: always draft the whole block)",
    )
    backend: Literal["torch", "onnx"] = "torch"
    seed: Seed = 0
    peer_baseline: StrictBool = True
    timing_repeats: int = Field(
        3, ge=1, description="the most passes over the prompts, baseline and speculative interleaved; speedup is "
        "their median",
    )
    settled_spread: float = Field(
        0.1, ge=0, description="after two passes, a temperature x domain whose every drafter's speedup spread "
        "((max - min) / median) is at most this takes no more passes (0: always timing_repeats)",
    )
    max_speedup_spread: float = Field(
        0.25, gt=0, description="(max - min) / median of the repeats' speedups above which evaluate says the "
        "timing is too noisy to decide on",
    )

    @field_validator("temperatures")
    @classmethod
    def _temperatures_range(cls, value: list[float]) -> list[float]:
        for temperature in value:
            if not (0.0 <= temperature <= 5.0) or math.isnan(temperature):
                raise ValueError(f"temperatures must be in [0, 5], got {temperature}")
        return unique(value, "temperatures")

    @field_validator("drafters")
    @classmethod
    def _unique_drafters(cls, value: list[str]) -> list[str]:
        return unique(value, "drafter kinds")
