"""The arguments of a `vllm serve` a stage starts itself: `corpus.vllm` (build_corpus) and `features.vllm`
(extract_features)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from pipeline.config.section import Section


class VllmConfig(Section):
    """Arguments of the `vllm serve` that `corpus.engine: vllm` or `features.engine: vllm` starts (see `vllm serve --help`)."""

    tensor_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    max_model_len: Optional[int] = Field(None, ge=16, description="null: the model's own limit")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    dtype: Optional[Literal["auto", "float32", "bfloat16", "float16"]] = Field(
        None, description="null: verifier.dtype, so the engine computes in the precision HF generation uses"
    )
    extra_args: list[str] = Field(default_factory=list, description="appended to the `vllm serve` command line")
    startup_timeout_s: float = Field(900.0, gt=0)
