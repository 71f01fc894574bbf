"""`train.eagle3`: the EAGLE-3 head on the verifier's hidden states."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, StrictBool, field_validator, model_validator

from pipeline.config.section import Section, unique
from pipeline.config.trainer_config import DistillTemperature, TrainerConfig, VerifierFeatures
from pipeline.errors import DraftlineError


class Eagle3LossConfig(Section):
    """Weights of the EAGLE-3 head's loss terms; unrolled step j is weighted decay**j.

    `fkl` is forward KL against the verifier's distribution restricted to the draft vocabulary (at
    `temperature`); `ce` is cross-entropy on the verifier's argmax (positions whose argmax lies outside
    the draft vocabulary carry no ce term).
    """

    ce: float = Field(0.0, ge=0)
    fkl: float = Field(1.0, ge=0)
    temperature: DistillTemperature = 1.0
    decay: float = Field(0.8, gt=0, le=1)

    @model_validator(mode="after")
    def _some_weight(self) -> "Eagle3LossConfig":
        if self.ce + self.fkl <= 0:
            raise ValueError("at least one of ce/fkl must have a weight > 0")
        return self


class Eagle3DrafterConfig(Section):
    aux_layer_ids: Optional[list[int]] = Field(
        None, min_length=1, description="verifier layers (low, middle, high) whose outputs feed the head, in vLLM's "
        "numbering (id L = the input of layer L); null: vLLM's default (2, n//2, n−3), spread out when those collide",
    )
    draft_vocab_size: Optional[int] = Field(
        None, ge=2, description="null: the verifier's vocabulary; else the head predicts only the corpus's most "
        "frequent tokens (d2t/t2d maps)",
    )
    intermediate_size: Optional[int] = Field(None, ge=16, description="null: the verifier's")
    norm_before_residual: StrictBool = False
    ttt_steps: int = Field(3, ge=1, le=16, description="training-time test: the head unrolled on its own outputs")
    draft_tokens: int = Field(3, ge=1, le=32, description="k drafted per verifier step")
    prompt_positions: StrictBool = Field(
        True, description="training also predicts prompt tokens (more targets from a small corpus); validation "
        "counts only predictions of response tokens",
    )
    loss: Eagle3LossConfig = Eagle3LossConfig()
    decode_prompts: int = Field(4, ge=0, description="validation prompts greedily decoded with the head (real tau)")
    cache_verifier_outputs: StrictBool = Field(
        False, description="keep each batch's verifier outputs (aux hidden states, argmax; draft-vocabulary logits "
        "for fkl) after its first forward and reuse them every later epoch; online only: offline the stored features "
        "already are that cache",
    )
    features: VerifierFeatures = "offline"
    trainer: TrainerConfig = TrainerConfig()

    @field_validator("aux_layer_ids")
    @classmethod
    def _distinct(cls, value: Optional[list[int]]) -> Optional[list[int]]:
        return None if value is None else unique(value, "aux layer ids")


def default_aux_layer_ids(depth: int) -> list[int]:
    """vLLM's default for a verifier of `depth` layers, (2, depth // 2, depth − 3), when those are three
    distinct ids in 1..depth−1; otherwise (shallow verifiers) up to three spread over 1..depth−1.

    Layer id L is the residual stream entering layer L: HF `hidden_states[L]`. The last layer's output
    is excluded because HF returns it after the final norm while vLLM taps it before.
    """
    if depth < 2:
        raise DraftlineError(f"EAGLE-3 needs a verifier with >= 2 layers, got {depth}")
    ids = [2, depth // 2, depth - 3]
    if len(set(ids)) == 3 and all(1 <= i < depth for i in ids):
        return ids
    count = min(3, depth - 1)
    if count == 1:
        return [1]
    return sorted({int(round(1 + i * (depth - 2) / (count - 1))) for i in range(count)})


def feature_layers(cfg: Eagle3DrafterConfig, depth: int) -> set[int]:
    """The verifier `hidden_states` indices the head reads (its aux layer ids are those indices): what
    extract_features stores for it (pipeline/features/store.py)."""
    return set(cfg.aux_layer_ids or default_aux_layer_ids(depth))
