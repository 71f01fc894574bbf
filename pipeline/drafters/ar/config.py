"""`train.ar`: the standalone autoregressive draft model."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from pipeline.config.section import Section
from pipeline.config.trainer_config import LossConfig, TrainerConfig, VerifierFeatures


class ARDrafterConfig(Section):
    architecture: Literal["qwen3", "llama"] = "qwen3"
    num_layers: int = Field(1, ge=1, le=64)
    hidden_size: Optional[int] = Field(None, ge=16, description="None: the verifier's width")
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    head_dim: Optional[int] = Field(None, ge=8)
    intermediate_size: Optional[int] = Field(None, ge=16)
    init: Literal["verifier", "scratch", "pretrained"] = "verifier"
    init_path: Optional[str] = None
    # k, the tokens drafted per verifier step: trained for, recorded in training.json, and read from
    # there by export (launch configs), evaluate and serve_check, so they always match the drafter.
    draft_tokens: int = Field(4, ge=1, le=32)
    features: VerifierFeatures = "offline"
    loss: LossConfig = LossConfig()
    trainer: TrainerConfig = TrainerConfig()

    @model_validator(mode="after")
    def _pretrained_path(self) -> "ARDrafterConfig":
        if self.init == "pretrained" and not self.init_path:
            raise ValueError("init is 'pretrained' but init_path is not set")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        return self


def feature_layers(cfg: ARDrafterConfig, depth: int) -> set[int]:
    """None beyond the last layer every feature set holds: the AR drafter learns the verifier's logits only."""
    return set()
