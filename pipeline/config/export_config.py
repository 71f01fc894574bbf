"""`export`: ONNX export and parity tolerances, TensorRT engine builds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from pipeline.config.base import DRAFTER_NAMES, DrafterName
from pipeline.config.section import Section, unique


class ProfileConfig(Section):
    """TensorRT optimisation profile for the dynamic axes (min/opt/max)."""

    batch: tuple[int, int, int] = (1, 1, 4)
    seq: tuple[int, int, int] = (1, 8, 64)
    past: tuple[int, int, int] = (0, 64, 512)

    @field_validator("batch", "seq", "past")
    @classmethod
    def _ordered(cls, value: tuple[int, int, int]) -> tuple[int, int, int]:
        if not (0 <= value[0] <= value[1] <= value[2]):
            raise ValueError(f"expected min <= opt <= max (all >= 0), got {list(value)}")
        return value


class GgufConfig(Section):
    """The GGUF files llama.cpp's converter writes for llama.cpp (docs/serving.md#llamacpp)."""

    pre_tokenizer: str | None = Field(
        None, min_length=1,
        description="llama.cpp's name for the verifier tokenizer's pre-tokenizer (e.g. gpt-2), for a tokenizer "
                    "missing from the converter's table of known tokenizers; null: the converter's table, then gpt-2 "
                    "for a plain byte-level BPE (the demo's), else the export fails naming this key")


class ExportConfig(Section):
    kinds: list[DrafterName] = Field(default_factory=lambda: list(DRAFTER_NAMES), min_length=1)

    @field_validator("kinds")
    @classmethod
    def _unique_kinds(cls, value: list[str]) -> list[str]:
        return unique(value, "drafter kinds")
    opset: int = Field(18, ge=14, le=23)
    exporter: Literal["dynamo", "torchscript"] = "dynamo"
    atol: float = Field(1e-4, gt=0)
    rtol: float = Field(1e-3, gt=0)
    parity_steps: int = Field(20, ge=1)
    parity_prompts: int = Field(3, ge=1, description="corpus test prompts used by the parity checks")
    tensorrt: Literal["auto", "required", "off"] = "auto"
    trt_precision: Literal["fp32", "fp16", "bf16"] = "fp32"
    trt_workspace_mb: int = Field(1024, ge=16)
    profile: ProfileConfig = ProfileConfig()
    gguf: GgufConfig = GgufConfig()
