"""The Lightning trainer, the AR-style loss mixture and where the verifier's outputs come from, shared by every
drafter kind's `train.<kind>` section."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, Field, StrictBool, field_validator, model_validator

from pipeline.config.section import Section

# `train.<kind>.features`
VerifierFeatures = Annotated[Literal["offline", "online"], Field(
    description="offline: learn from artifacts/features (stage extract_features) and never load the verifier's decoder "
    "layers, so any verifier size trains; online: run the verifier forward in every training process",
)]

MuonPrecision = Literal["auto", "bfloat16", "float32"]




def at_most(limit: float, reason: str) -> AfterValidator:
    """An upper bound whose error says why it is there: pydantic's own `le` only says "less than or equal", and a
    value far past any sensible one (`feature_noise: 1e30`) trains garbage without a word."""
    def check(value: float | None) -> float | None:
        if value is not None and value > limit:
            raise ValueError(f"at most {limit:g}: {reason}")
        return value
    return AfterValidator(check)


# Every kind's distillation temperature (`train.<kind>.loss.temperature`).
DistillTemperature = Annotated[float, Field(gt=0), at_most(
    10, "the verifier's distribution softened that far is nearly uniform, so the drafter learns next to nothing "
    "from it (distillation uses 1-2)")]


class TrainerConfig(Section):
    strategy: Literal["auto", "ddp", "deepspeed_stage_2", "deepspeed_stage_3"] = "auto"
    devices: int | Literal["auto"] = 1
    num_nodes: int = Field(1, ge=1)
    rendezvous_timeout_s: float = Field(
        30, gt=0, le=3600, description="how long a multi-process launch waits for every process to join, first thing "
        "in training (before any loading, so launchers that start every process at once meet within seconds); "
        "then one line naming who is missing",
    )
    accelerator: Literal["auto", "cpu", "gpu"] = "auto"
    precision: Literal["32-true", "bf16-mixed", "16-mixed", "bf16-true"] = "32-true"
    offload_optimizer: StrictBool = False
    offload_parameters: StrictBool = False
    max_steps: int = Field(300, ge=1)
    epochs: Optional[float] = Field(
        None, gt=0, description="null: train max_steps; N: as many steps as N passes over the training split "
        "take (max_steps is then ignored), so the budget follows the corpus of whatever verifier is used",
    )
    batch_size: int = Field(16, ge=1)
    accumulate_grad_batches: int = Field(1, ge=1)
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw", description="muon: torch.optim.Muon for the hidden weight matrices, AdamW for the rest "
        "(pipeline/training/muon.py); not with deepspeed_stage_* strategies, which hand Muon flattened shards",
    )
    muon_precision: MuonPrecision = Field(
        "auto", description="the dtype of Muon's Newton-Schulz iteration; auto: bfloat16 where a measured matmul "
        "probe finds it faster than float32 on the training device (native bf16: GPUs, AVX512-BF16, AMX), else "
        "float32 (with AVX2 kernels only, bf16 made it 19x slower and a demo block step 1.8x); the dtype used is in "
        "metrics/train_<kind>.json",
    )
    learning_rate: float = Field(2e-3, gt=0, lt=1)
    weight_decay: Annotated[float, at_most(
        1, "AdamW shrinks every weight by learning_rate x weight_decay each step, so above 1 the decay, not the "
        "loss, sets the weights (usual: 0-0.1)")] = Field(0.01, ge=0)
    warmup_steps: int = Field(20, ge=0)
    lr_schedule: Literal["cosine", "linear"] = Field(
        "cosine", description="after the linear warm-up: cosine to 10% of the peak at max_steps, or linear to 0",
    )
    grad_clip: float = Field(1.0, gt=0)
    val_every_n_steps: int = Field(100, ge=1)
    max_seq_len: int = Field(192, ge=8)
    num_workers: int = Field(0, ge=0)
    checkpoint_every_n_steps: int = Field(50, ge=1)

    @field_validator("devices")
    @classmethod
    def _devices_positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("devices must be >= 1 or 'auto'")
        return value

    @model_validator(mode="after")
    def _offload_needs_deepspeed(self) -> "TrainerConfig":
        if (self.offload_optimizer or self.offload_parameters) and not self.strategy.startswith("deepspeed"):
            raise ValueError("offload_optimizer/offload_parameters need a deepspeed_stage_* strategy")
        if self.offload_parameters and self.strategy != "deepspeed_stage_3":
            raise ValueError("offload_parameters needs strategy 'deepspeed_stage_3'")
        if self.optimizer == "muon" and self.strategy.startswith("deepspeed"):
            raise ValueError(f"optimizer 'muon' cannot run under strategy '{self.strategy}' (ZeRO hands the "
                             "optimizer flattened shards, Muon needs whole matrices); use 'auto' or 'ddp', or adamw")
        return self


class LossConfig(Section):
    """Weights of the loss terms (a mixture when several are > 0) and the distillation temperature."""

    ce: float = Field(0.0, ge=0)
    fkl: float = Field(1.0, ge=0)
    rkl: float = Field(0.0, ge=0)
    tvd: float = Field(0.0, ge=0)
    jsd: float = Field(0.0, ge=0)
    temperature: DistillTemperature = 1.0

    @model_validator(mode="after")
    def _some_weight(self) -> "LossConfig":
        if self.ce + self.fkl + self.rkl + self.tvd + self.jsd <= 0:
            raise ValueError("at least one of ce/fkl/rkl/tvd/jsd must have a weight > 0")
        return self
