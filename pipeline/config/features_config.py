"""`features`: stage `extract_features`, which writes the verifier's hidden states as a dataset for the kinds
trained offline (`train.<kind>.features: offline`; pipeline/features/store.py holds the format)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, PositiveInt

from pipeline.config.section import Section, cross_check
from pipeline.config.vllm_config import VllmConfig
from pipeline.drafters.registry import KIND_SPECS

# The stored precisions; float8_e4m3 keeps a float32 scale per token and layer beside the e4m3 values
FeatureDType = Literal["float32", "bfloat16", "float16", "float8_e4m3"]


class FeaturesConfig(Section):
    # hf: the verifier in-process (the demo; `device_map` spreads one too big for a GPU over several);
    # vllm: `vllm` with `extract_hidden_states` from .venv-serve, for big verifiers and many GPUs
    engine: Literal["hf", "vllm"] = "hf"
    dtype: FeatureDType = Field(
        "bfloat16", description="stored precision: bfloat16 halves the bytes of float32 at the precision verifiers "
        "run in; float8_e4m3 halves bfloat16's again (plus 4 bytes a token and layer for its scale); float32 makes "
        "offline training equal online training to float tolerance",
    )
    max_seq_len: int = Field(
        192, ge=8, description="rows are cut to this many tokens (prompt start first, as training cuts them); every "
        "kind trained offline must train at the same `trainer.max_seq_len`",
    )
    batch_size: PositiveInt = Field(16, description="rows per verifier forward (engine hf)")
    shard_rows: PositiveInt = Field(256, description="rows per shard: the unit a killed run redoes and `--part` deals")
    device_map: Optional[str] = Field(
        None, description="engine hf: null = one device; 'auto' spreads a verifier too big for one GPU over all of them",
    )
    vllm: VllmConfig = VllmConfig()


def offline_kinds(train) -> list[str]:
    """The kinds params train from extracted features."""
    return [name for name in KIND_SPECS if getattr(train, name).features == "offline"]


def stored_layers(train, kinds: list[str], depth: int) -> list[int]:
    """The layers extract_features stores for `kinds` on a `depth`-layer verifier: those they read, and N, which
    every feature set holds; none when no kind is offline."""
    if not kinds:
        return []
    wanted = {depth}
    for name in kinds:
        wanted |= KIND_SPECS[name].module("config").feature_layers(getattr(train, name), depth)
    return sorted(wanted)


@cross_check("features", "train")
def _offline_rows_match(params) -> None:
    """Features are cut at one length; a kind cutting rows elsewhere would read states of other tokens."""
    for name in offline_kinds(params.train):
        length = getattr(params.train, name).trainer.max_seq_len
        if length != params.features.max_seq_len:
            raise ValueError(f"train.{name}.trainer.max_seq_len {length} differs from features.max_seq_len "
                             f"{params.features.max_seq_len}, and train.{name} trains offline from those features; "
                             f"set them equal (or train.{name}.features: online)")
