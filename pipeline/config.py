"""Typed `params.yaml`: one pydantic model per stage section, validated before any stage runs.

Every section forbids unknown keys so a typo fails loudly instead of silently using a default.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Annotated, Literal, Optional, Union, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    StrictBool,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.errors import ParamsError, redact_url

# Drafter kinds by name; each has its package under pipeline/drafters/ (registry.py maps name -> kind).
DrafterName = Literal["ar", "block", "eagle3"]
DRAFTER_NAMES: tuple[str, ...] = get_args(DrafterName)

DEFAULT_PARAMS_PATH = Path("params.yaml")

# A domain is whatever the corpus sources call it; no dots, since metrics are keyed `<domain>.<metric>`.
DOMAIN_PATTERN = r"^[A-Za-z0-9_-]+$"
DomainName = Annotated[str, StringConstraints(pattern=DOMAIN_PATTERN)]
# The built-in sources' domain when they name none.
STDLIB_DOMAINS = {"stdlib_code": "code", "stdlib_text": "text"}


class Section(BaseModel):
    # inf/nan would silently disable a threshold (`atol: .inf`, `min_speedup: .inf`).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _unique(value: list, what: str = "entries") -> list:
    """`[ar, ar]` would run (and register) the same drafter twice."""
    duplicates = sorted({str(item) for item in value if value.count(item) > 1})
    if duplicates:
        raise ValueError(f"duplicate {what} {duplicates}")
    return value


# --------------------------------------------------------------------------- project / verifier


class ProjectConfig(Section):
    seed: int = Field(0, ge=0)
    artifacts_dir: str = "artifacts"
    metrics_dir: str = "metrics"
    plots_dir: str = "plots"
    # Stages replace their output directories wholesale, so a typo like `/etc` must not be obeyed.
    allow_system_dirs: StrictBool = False
    # A relative dir climbing out of the project (`../../..`) is a typo far more often than a plan.
    allow_outside: StrictBool = False

    @model_validator(mode="after")
    def _no_system_dirs(self) -> "ProjectConfig":
        if self.allow_system_dirs:
            return self
        for name, path in self.output_dirs().items():
            if path.is_absolute() and len(path.resolve().parts) <= 2:
                raise ValueError(
                    f"{name} '{path}' is a top-level system directory; use a path inside the project, "
                    "or set project.allow_system_dirs: true if you mean it"
                )
        return self

    @model_validator(mode="after")
    def _relative_dirs_stay_inside(self) -> "ProjectConfig":
        if self.allow_outside:
            return self
        for name, path in self.output_dirs().items():
            if not path.is_absolute() and os.path.normpath(path).split(os.sep)[0] == os.pardir:
                raise ValueError(
                    f"{name} '{path}' leaves the project directory; use a path inside it (or an absolute path), "
                    "or set project.allow_outside: true if you mean it"
                )
        return self

    def output_dirs(self) -> dict[str, Path]:
        return {name: Path(getattr(self, name)) for name in ("artifacts_dir", "metrics_dir", "plots_dir")}

    def dirs_outside(self, project: Path) -> list[str]:
        """Output dirs that resolve outside `project` (allowed, but worth a warning: easy to mistype)."""
        project = project.resolve()
        return [f"{name} {path}" for name, path in self.output_dirs().items()
                if not (project / path).resolve().is_relative_to(project)]


class BootstrapConfig(Section):
    """The offline demo verifier: a byte-level BPE tokenizer + small Qwen3 trained on the stdlib.

    Training runs exactly `max_steps` optimizer steps from `project.seed`, so the same params give the
    same weights; `max_time_s` only guards against a run far slower than planned (it fails, it never
    stops early with a different model).
    """

    # Small vocabulary: the LM head and softmax dominate a 128-wide model's cost at 4096 entries.
    vocab_size: int = Field(1024, ge=300, le=65536)
    # Deep and narrow: a verifier forward must cost clearly more than a 1-2 layer drafter's.
    hidden_size: int = Field(128, ge=16, le=4096)
    num_layers: int = Field(6, ge=2, le=64)
    num_heads: int = Field(4, ge=1, le=64)
    num_kv_heads: int = Field(2, ge=1, le=64)
    intermediate_size: int = Field(384, ge=16)
    head_dim: int = Field(32, ge=8, le=256)
    max_position_embeddings: int = Field(512, ge=64)
    seq_len: int = Field(256, ge=16, le=4096)
    batch_size: int = Field(8, ge=1)
    max_steps: int = Field(900, ge=1)
    # Guard only: a run past this many seconds of training fails with one line and writes nothing.
    max_time_s: float = Field(3600.0, gt=0)
    # Fixed, not "all cores": the reduction order (hence the weights) then depends only on params.
    # On the 2-core demo box, unloaded, 2 threads train 1.6x faster than 1 (290 vs 465 ms a step); on
    # an oversubscribed box 1 thread is faster, and either count is bitwise reproducible.
    threads: int = Field(2, ge=1, le=256)
    # bf16 autocast pays only where the CPU has native bf16 (avx512_bf16 / AMX); elsewhere it is slower.
    autocast_bf16: StrictBool = False
    learning_rate: float = Field(4e-3, gt=0, lt=1)
    warmup_steps: int = Field(50, ge=0)
    max_corpus_chars: int = Field(3_000_000, ge=10_000)
    eval_every: int = Field(100, ge=1)

    @model_validator(mode="after")
    def _heads_divide(self) -> "BootstrapConfig":
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        return self


class VerifierConfig(Section):
    source: Literal["bootstrap", "hf"] = "bootstrap"
    name_or_path: Optional[str] = None
    trust_remote_code: StrictBool = False
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    bootstrap: BootstrapConfig = BootstrapConfig()

    @model_validator(mode="after")
    def _hf_needs_path(self) -> "VerifierConfig":
        if self.source == "hf" and not self.name_or_path:
            raise ValueError("verifier.source is 'hf' but verifier.name_or_path is not set")
        return self


# --------------------------------------------------------------------------- corpus


class PromptSourceConfig(Section):
    """One prompt source, mapped to (prompt, domain).

    `kind`: `stdlib_code` / `stdlib_text` are built in and offline; `file` reads JSON/JSONL/JSONL.GZ/
    Parquet; `hf` loads a dataset by name from the local HF cache.
    """

    kind: Literal["stdlib_code", "stdlib_text", "file", "hf"]
    domain: Optional[DomainName] = None
    path: Optional[str] = None
    name: Optional[str] = None
    subset: Optional[str] = None
    split: str = "train"
    prompt_field: str = "prompt"
    domain_field: Optional[str] = None
    limit: Optional[int] = Field(None, ge=1)
    # Prompts are user turns (MT-Bench style): with a chat-template verifier they are sent as chat
    # messages and the stored prompt ids are the templated ids.
    chat: StrictBool = False

    @model_validator(mode="after")
    def _kind_fields(self) -> "PromptSourceConfig":
        if self.kind == "file" and not self.path:
            raise ValueError("a 'file' source needs 'path'")
        if self.kind == "hf" and not self.name:
            raise ValueError("an 'hf' source needs 'name'")
        if self.kind in ("file", "hf") and self.domain is None and self.domain_field is None:
            raise ValueError("a 'file'/'hf' source needs 'domain' or 'domain_field'")
        return self

    @property
    def fixed_domain(self) -> str | None:
        """The domain of every prompt of this source; None when a record field decides it."""
        return None if self.domain_field else self.domain or STDLIB_DOMAINS.get(self.kind)


class SamplingConfig(Section):
    """How tokens are drawn (pipeline/sampling.py); temperature 0 is greedy."""

    temperature: float = Field(0.0, ge=0.0, le=5.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SplitConfig(Section):
    validation: float = Field(0.1, ge=0.0, lt=0.5)
    test: float = Field(0.1, ge=0.0, lt=0.5)

    @model_validator(mode="after")
    def _leaves_training_data(self) -> "SplitConfig":
        if self.validation + self.test > 0.5:
            raise ValueError(
                f"validation + test = {self.validation + self.test:g} leaves less than half the prompts to train on; "
                "keep their sum <= 0.5"
            )
        return self


class VllmConfig(Section):
    """Arguments of the `vllm serve` that `corpus.engine: vllm` starts (see `vllm serve --help`)."""

    tensor_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    max_model_len: Optional[int] = Field(None, ge=16, description="null: the model's own limit")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    dtype: Optional[Literal["auto", "float32", "bfloat16", "float16"]] = Field(
        None, description="null: verifier.dtype, so the engine computes in the precision HF generation uses"
    )
    extra_args: list[str] = Field(default_factory=list, description="appended to the `vllm serve` command line")
    startup_timeout_s: float = Field(900.0, gt=0)


class CorpusConfig(Section):
    sources: list[PromptSourceConfig] = Field(
        default_factory=lambda: [
            PromptSourceConfig(kind="stdlib_code", domain="code"),
            PromptSourceConfig(kind="stdlib_text", domain="text"),
        ],
        min_length=1,
    )
    max_prompts_per_domain: Union[int, dict[DomainName, int]] = Field(
        400, description="one limit for every domain, or a limit per domain name (domains left out: no limit)"
    )
    prompt_max_tokens: int = Field(96, ge=4)
    max_new_tokens: int = Field(64, ge=1)
    sampling: SamplingConfig = SamplingConfig()
    greedy_share: float = Field(
        0.0, ge=0.0, le=1.0,
        description="fraction of prompts (chosen by id) answered greedily whatever `sampling` says",
    )
    batch_size: int = Field(16, ge=1)
    shard_size: int = Field(64, ge=1)
    seed: int = Field(0, ge=0)
    split: SplitConfig = SplitConfig()
    # hf: generate in-process (the demo); vllm: start `vllm serve` from .venv-serve for the stage;
    # openai: already-running OpenAI-compatible servers listed in `endpoints` (one replica per node)
    engine: Literal["hf", "vllm", "openai"] = "hf"
    vllm: VllmConfig = VllmConfig()
    endpoints: list[str] = Field(default_factory=list, description="base URLs, e.g. http://node1:8000/v1")
    concurrency: int = Field(64, ge=1, description="requests in flight per endpoint")
    request_timeout_s: float = Field(600.0, gt=0)
    retries: int = Field(4, ge=0, description="per request, with exponential backoff, before an endpoint counts as down")

    @model_validator(mode="after")
    def _openai_needs_endpoints(self) -> "CorpusConfig":
        if self.engine == "openai" and not self.endpoints:
            raise ValueError("corpus.engine is 'openai' but corpus.endpoints is empty; list the servers' base URLs")
        for url in self.endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"corpus.endpoints: '{redact_url(url)}' is not an http(s) URL")
        return self

    @field_validator("max_prompts_per_domain")
    @classmethod
    def _positive_limits(cls, value: int | dict[str, int]) -> int | dict[str, int]:
        for domain, limit in (value.items() if isinstance(value, dict) else [("every", value)]):
            if limit < 1:
                raise ValueError(f"limit for domain '{domain}' must be >= 1, got {limit}")
        return value

    def prompt_limit(self, domain: str) -> int | None:
        limits = self.max_prompts_per_domain
        return limits.get(domain) if isinstance(limits, dict) else limits

    def domains(self) -> set[str] | None:
        """The domains the sources give; None when a source reads them from its records."""
        fixed = [source.fixed_domain for source in self.sources]
        return None if None in fixed else set(fixed)


# --------------------------------------------------------------------------- training


class TrainerConfig(Section):
    strategy: Literal["auto", "ddp", "deepspeed_stage_2", "deepspeed_stage_3"] = "auto"
    devices: int | Literal["auto"] = 1
    num_nodes: int = Field(1, ge=1)
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
    learning_rate: float = Field(2e-3, gt=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)
    warmup_steps: int = Field(20, ge=0)
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
        return self


class LossConfig(Section):
    """Weights of the loss terms (a mixture when several are > 0) and the distillation temperature."""

    ce: float = Field(0.0, ge=0)
    fkl: float = Field(1.0, ge=0)
    rkl: float = Field(0.0, ge=0)
    tvd: float = Field(0.0, ge=0)
    jsd: float = Field(0.0, ge=0)
    temperature: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _some_weight(self) -> "LossConfig":
        if self.ce + self.fkl + self.rkl + self.tvd + self.jsd <= 0:
            raise ValueError("at least one of ce/fkl/rkl/tvd/jsd must have a weight > 0")
        return self


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
    loss: LossConfig = LossConfig()
    # Sized so train_ar takes a few minutes on a 2-core CPU with the demo verifier.
    trainer: TrainerConfig = TrainerConfig(max_steps=100, val_every_n_steps=50, checkpoint_every_n_steps=25)

    @model_validator(mode="after")
    def _pretrained_path(self) -> "ARDrafterConfig":
        if self.init == "pretrained" and not self.init_path:
            raise ValueError("init is 'pretrained' but init_path is not set")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        return self


class BlockLossConfig(Section):
    """Weights of the block drafter's loss terms, each position-weighted by exp(−(k−1)/γ).

    `ce` is cross-entropy on `labels`: the verifier's argmax at anchor+k−1 (`verifier`) or the sampled
    corpus token (`corpus`); `fkl` is forward KL against the verifier's logits there, at `temperature`.
    """

    ce: float = Field(1.0, ge=0)
    fkl: float = Field(0.0, ge=0)
    confidence: float = Field(
        1.0, ge=0, description="weight of the confidence head's BCE against each position's acceptance rate "
        "(train.block.confidence_head only)",
    )
    labels: Literal["verifier", "corpus"] = "verifier"
    greedy_chain: StrictBool = Field(
        True, description="position k >= 2 counts only where the response follows the verifier's argmax from the "
        "anchor up to k−1 (the chain greedy drafting continues); otherwise its label sits on a sampled detour",
    )
    temperature: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _some_weight(self) -> "BlockLossConfig":
        if self.ce + self.fkl <= 0:
            raise ValueError("at least one of ce/fkl must have a weight > 0")
        return self


LEARNED_MASK_WARNING = ("train.block.mask is 'learned': the block drafter will train, but vLLM, SGLang and "
                        "TensorRT-LLM cannot serve a learned mask embedding, so export will refuse it "
                        "('auto' picks a servable vocabulary id)")


class BlockDrafterConfig(Section):
    block_size: int = Field(8, ge=2, le=64)
    num_layers: int = Field(2, ge=1, le=5)
    num_heads: Optional[int] = Field(None, ge=1, description="None: the verifier's")
    num_kv_heads: Optional[int] = Field(None, ge=1)
    intermediate_size: Optional[int] = Field(None, ge=16)
    num_feature_layers: int = Field(
        5, ge=1, le=16,
        description="how many verifier layers feed the context features (fewer for shallow verifiers); not the "
        "saved config.json's num_target_layers, which is the verifier's depth, as serving stacks expect",
    )
    target_layer_ids: Optional[list[int]] = None
    mask: Literal["auto", "token", "learned"] = "auto"
    attention: Literal["bidirectional", "causal"] = Field(
        "bidirectional", description="inside the block: every position sees the whole block (DFlash), or only "
        "the anchor and earlier positions; exported as dflash_config.causal, which vLLM reads",
    )
    anchors_per_sequence: Union[Literal["all"], PositiveInt] = Field(
        "all", description="'all': every response (with prompt_anchors: every) position with a label after it; "
        "an int samples that many per sequence each step (for sequences too long to hold every block in memory)",
    )
    prompt_anchors: StrictBool = Field(
        False, description="training also anchors blocks at prompt positions (from 1; labels past position 1 only "
        "where the prompt follows the verifier's argmax, with greedy_chain): more blocks from a small corpus",
    )
    gamma: Optional[float] = Field(None, gt=0, description="None: 7 for B=16, 5 for 10, 4 for 8")
    markov_rank: int = Field(
        0, ge=0, le=4096, description="0: plain DFlash. r > 0: the DSpark variant, a rank-r Markov head (V x r, "
        "r x V) adding a bias from the previous block token to each position's logits, drafted left to right; "
        "exported for vLLM `method: dspark`",
    )
    confidence_head: StrictBool = Field(
        False, description="DSpark confidence head (needs markov_rank > 0): per-position acceptance estimate, "
        "which lets decoding cut a block short (evaluate.confidence_threshold)",
    )
    loss: BlockLossConfig = BlockLossConfig()
    decode_prompts: int = Field(
        4, ge=0, description="validation prompts greedily decoded with the drafter at every validation (real tau)",
    )
    cache_verifier_outputs: StrictBool = Field(
        False, description="keep each batch's verifier outputs (target-layer hidden states, argmax; logits too for "
        "fkl) after its first forward and reuse them every later epoch: exact, and saves the frozen forward per "
        "step; costs T·(num_feature_layers·hidden + 1) floats per corpus row (T·vocab more with fkl) of memory",
    )
    # Sized so the demo trains in a few minutes on 2 CPU cores (one verifier + drafter pass per step).
    trainer: TrainerConfig = TrainerConfig(batch_size=8, max_steps=200)

    @model_validator(mode="after")
    def _confidence_needs_markov(self) -> "BlockDrafterConfig":
        # vLLM's DSpark layout always carries a Markov head; a confidence head alone has no servable layout
        if self.confidence_head and self.markov_rank == 0:
            raise ValueError("confidence_head: true needs markov_rank > 0 (the DSpark layout)")
        return self


class Eagle3LossConfig(Section):
    """Weights of the EAGLE-3 head's loss terms; unrolled step j is weighted decay**j.

    `fkl` is forward KL against the verifier's distribution restricted to the draft vocabulary (at
    `temperature`); `ce` is cross-entropy on the verifier's argmax (positions whose argmax lies outside
    the draft vocabulary carry no ce term).
    """

    ce: float = Field(0.0, ge=0)
    fkl: float = Field(1.0, ge=0)
    temperature: float = Field(1.0, gt=0)
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
        "for fkl) after its first forward and reuse them every later epoch",
    )
    trainer: TrainerConfig = TrainerConfig(batch_size=8, max_steps=200)

    @field_validator("aux_layer_ids")
    @classmethod
    def _distinct(cls, value: Optional[list[int]]) -> Optional[list[int]]:
        return None if value is None else _unique(value, "aux layer ids")


class TrainConfig(Section):
    ar: ARDrafterConfig = ARDrafterConfig()
    block: BlockDrafterConfig = BlockDrafterConfig()
    eagle3: Eagle3DrafterConfig = Eagle3DrafterConfig()


# --------------------------------------------------------------------------- export


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


class ExportConfig(Section):
    kinds: list[DrafterName] = Field(default_factory=lambda: list(DRAFTER_NAMES), min_length=1)

    @field_validator("kinds")
    @classmethod
    def _unique_kinds(cls, value: list[str]) -> list[str]:
        return _unique(value, "drafter kinds")
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


# --------------------------------------------------------------------------- evaluation and promotion


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
    seed: int = Field(0, ge=0)
    peer_baseline: StrictBool = True
    timing_repeats: int = Field(
        3, ge=1, description="passes over the prompts, baseline and speculative interleaved; speedup is their median",
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
        return _unique(value, "temperatures")

    @field_validator("drafters")
    @classmethod
    def _unique_drafters(cls, value: list[str]) -> list[str]:
        return _unique(value, "drafter kinds")


class ServeCheckConfig(Section):
    """Stage `serve_check`: the exported drafters run in vLLM (the `make serve-env` environment)."""

    required: StrictBool = Field(True, description="promote refuses a drafter whose serve_check did not pass")
    prompts_per_domain: int = Field(8, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    max_tau_gap: float = Field(0.15, ge=0, description="largest relative gap vLLM tau vs draftline tau that passes")
    concurrency: int = Field(8, ge=1, description="requests sharing vLLM's batches in the batched runs")
    max_batch_tau_gap: float = Field(0.05, ge=0, description="largest relative gap batched vs single-request vLLM tau")
    sampled_z: float = Field(3.0, gt=0, description="T > 0: standard errors of the tau difference that pass")
    gate_sampled: StrictBool = Field(True, description="a T > 0 tau gap past sampled_z fails the drafter; "
                                     "false: it is recorded and warned about only")
    kv_cache_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE on CPU")
    enforce_eager: StrictBool = Field(True, description="skip vLLM's torch.compile warm-up (minutes on a small CPU)")
    engine_timeout_s: int = Field(1200, ge=30, description="wall-clock limit for one vLLM engine run")


class DomainGate(Section):
    min_tau: float = Field(1.0, ge=0)
    min_speedup: float = Field(0.0, ge=0)


class TrackingConfig(Section):
    """Where MLflow runs (training, promotion) and the model registry live; read by every stage that logs."""

    uri: Optional[str] = Field(None, description="None: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    experiment: str = "draftline"


class PromoteConfig(Section):
    model_name_prefix: str = "draftline"
    require_lossless: StrictBool = True
    max_regression: float = Field(0.05, ge=0, le=1)
    default_gate: DomainGate = DomainGate(min_tau=1.2, min_speedup=1.0)
    gates: dict[DomainName, DomainGate] = Field(
        default_factory=dict, description="floors for the named domains; every other domain gets default_gate",
    )

    def gate(self, domain: str) -> DomainGate:
        return self.gates.get(domain, self.default_gate)


class Params(Section):
    project: ProjectConfig = ProjectConfig()
    verifier: VerifierConfig = VerifierConfig()
    corpus: CorpusConfig = CorpusConfig()
    train: TrainConfig = TrainConfig()
    export: ExportConfig = ExportConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    tracking: TrackingConfig = TrackingConfig()
    serve_check: ServeCheckConfig = ServeCheckConfig()
    promote: PromoteConfig = PromoteConfig()

    @model_validator(mode="after")
    def _domains_have_sources(self) -> "Params":
        """A gate for a domain no source gives could never pass (its metrics never exist): said now, not
        as a missing metric at promote."""
        domains = self.corpus.domains()
        for domain in self.promote.gates if domains is not None else ():
            if domain not in domains:
                raise ValueError(f"promote.gates.{domain}: no corpus source has domain '{domain}' "
                                 f"(the sources give {sorted(domains)}); remove the gate or add a source")
        return self

    @model_validator(mode="after")
    def _target_layers_exist(self) -> "Params":
        """Caught here instead of minutes later in training, when the verifier's depth is known now."""
        layer_ids = self.train.block.target_layer_ids
        if layer_ids is None:
            return self
        if len(set(layer_ids)) != len(layer_ids) or min(layer_ids) < 0:
            raise ValueError(f"train.block.target_layer_ids {layer_ids} must be distinct layer indices >= 0")
        depth = self.verifier.bootstrap.num_layers
        if self.verifier.source == "bootstrap" and max(layer_ids) >= depth:
            raise ValueError(
                f"train.block.target_layer_ids {layer_ids} out of range for the {depth}-layer bootstrap verifier "
                f"(valid: 0..{depth - 1})"
            )
        return self

    def section_hash(self, *names: str) -> str:
        """Stable hash of the named sections (all when none), recorded as lineage."""
        dumped = self.model_dump(mode="json")
        chosen = {name: dumped[name] for name in (names or dumped.keys())}
        return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:16]


def _format_error(source: str, error: ValidationError) -> str:
    first = error.errors()[0]
    location = "".join(f"{part}: " for part in [".".join(str(part) for part in first["loc"])] if part)
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key (remove it or check the spelling)"
    elif "input" in first and first["type"] not in ("missing",) and not isinstance(first["input"], dict):
        message = f"{message} (got {first['input']!r})"
    more = f" (+{error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{source}: {location}{message}{more}"


def parse_params(data: object, source: str = "params") -> Params:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParamsError(f"{source}: expected a mapping of sections at the top level, got {type(data).__name__}")
    try:
        return Params.model_validate(data)
    except ValidationError as error:
        raise ParamsError(_format_error(source, error)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in params that hides which value is in effect."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (keep one)", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_params(path: str | Path = DEFAULT_PARAMS_PATH) -> Params:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: file not found (run from the project root or pass --params PATH)")
    if not path.is_file():
        raise ParamsError(f"{path}: not a file (pass --params with the path of a params.yaml)")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as error:
        raise ParamsError(f"{path}: not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ParamsError(f"{path}: not valid YAML{where}: {getattr(error, 'problem', error)}") from None
    return parse_params(data, str(path))
