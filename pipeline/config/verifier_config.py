"""`verifier`: the model drafters are trained for, and the offline demo verifier `bootstrap` trains."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, StrictBool, model_validator

from pipeline.config.section import Section


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
    # Load an external verifier's pickled weights (`*.bin`, `*.pt`, ...), unpickled weights-only (tensors and
    # plain containers; anything else is refused). Off: only *.safetensors load, any pickle is refused.
    allow_pickle_weights: StrictBool = False
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    bootstrap: BootstrapConfig = BootstrapConfig()

    @model_validator(mode="after")
    def _hf_needs_path(self) -> "VerifierConfig":
        if self.source == "hf" and not self.name_or_path:
            raise ValueError("verifier.source is 'hf' but verifier.name_or_path is not set")
        return self
