"""`train.block` and `train.dspark`: the block family's sections. `BlockFamilyConfig` holds what both kinds
share (the DFlash pass, its loss and trainer); `BlockDrafterConfig` is plain DFlash, and the DSpark kind
(pipeline/drafters/dspark/config.py) adds its Markov and confidence heads on top."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Optional, Union

from pydantic import Field, PositiveInt, StrictBool, model_validator

from pipeline.config.section import Section, cross_check
from pipeline.config.trainer_config import DistillTemperature, TrainerConfig, VerifierFeatures, at_most
from pipeline.errors import DraftlineError


class BlockLossConfig(Section):
    """Weights of the block drafter's loss terms, each position-weighted (`position_weights`).

    `ce` is cross-entropy on `labels`: the verifier's argmax at anchor+k−1 (`verifier`) or the sampled
    corpus token (`corpus`); `fkl` is forward KL against the verifier's logits there, at `temperature`.
    """

    ce: float = Field(1.0, ge=0)
    fkl: float = Field(
        1.0, ge=0, description="1 (with ce 1): on the demo (Muon + D-PACE, 2 seeds, 156 prompts) tau at T=0.8 code "
        "1.53 -> 1.82, text 1.54 -> 1.78, at T=0 unchanged (3.01 -> 3.03, 4.21 -> 4.22): argmax CE teaches only the "
        "top token, sampled drafts need the verifier's whole distribution; 0: argmax CE alone",
    )
    confidence: float = Field(
        1.0, ge=0, description="weight of the confidence head's BCE against each position's acceptance rate "
        "(train.dspark with confidence_head only)",
    )
    labels: Literal["verifier", "corpus"] = "verifier"
    greedy_chain: StrictBool = Field(
        True, description="position k >= 2 counts only where the response follows the verifier's argmax from the "
        "anchor up to k−1 (the chain greedy drafting continues); otherwise its label sits on a sampled detour",
    )
    temperature: DistillTemperature = 1.0
    position_weights: Literal["exponential", "dpace"] = Field(
        "dpace", description="dpace: with Muon on the demo (2 seeds, 156 prompts) greedy tau code 2.86 -> 3.01, text "
        "4.05 -> 4.21 over exponential, at T=0.8 code 1.59 -> 1.53, text 1.57 -> 1.54 (the greedy gain is 3-6x the "
        "sampled loss). exponential: fixed w_k = exp(−(k−1)/γ) (the section's gamma); dpace: per block, "
        "from the drafter's own detached confidence q_i = exp(−CE_i) smoothed by dpace_alpha, w_k = Σ_{j≥k} Π_{i≤j} q_i, "
        "the gradient of the block's expected accepted length (D-PACE)",
    )
    dpace_alpha: float = Field(0.5, gt=0, le=1, description="D-PACE smoothing: q_i → (1 − α)·q_i + α")

    @model_validator(mode="after")
    def _some_weight(self) -> "BlockLossConfig":
        if self.ce + self.fkl <= 0:
            raise ValueError("at least one of ce/fkl must have a weight > 0")
        return self


class BlockTrainerConfig(TrainerConfig):
    """The shared trainer section with the block drafter's own measured defaults (train/block_recipe_bench.py)."""

    optimizer: Literal["adamw", "muon"] = Field(
        "muon", description="muon (torch.optim.Muon for the hidden matrices, AdamW for the rest): on the demo "
        "(500 steps of 8; greedy decoding of all 156 test+validation prompts, 48 tokens; 2 seeds) tau at T=0 "
        "code 2.54 -> 2.86 (+13%), text 3.87 -> 4.05 (+5%), at T=0.8 unchanged (1.56 both domains), the seed "
        "spread 0.04-0.08; adamw: what the other kinds use",
    )


def learned_mask_warning(kind: str) -> str:
    return (f"train.{kind}.mask is 'learned': the {kind} drafter will train, but vLLM, SGLang and TensorRT-LLM "
            "cannot serve a learned mask embedding, so export will refuse it ('auto' picks a servable vocabulary id)")


class BlockFamilyConfig(Section):
    """What the block family's kinds share; each kind's section is a subclass naming its `kind`."""

    kind: ClassVar[str]
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
        64, description="'all': every response (with prompt_anchors: every) position with a label after it; "
        "an int samples that many per sequence each step (64 trained the demo drafter as well as 'all', at less cost "
        "per step)",
    )
    prompt_anchors: StrictBool = Field(
        True, description="training also anchors blocks at prompt positions (from 1; labels past position 1 only "
        "where the prompt follows the verifier's argmax, with greedy_chain): more blocks from a small corpus",
    )
    feature_noise: Annotated[float, at_most(
        1, "uniform noise that wide drowns the verifier's hidden states the drafter reads, so it trains on noise "
        "(the peer's DFlash recipe uses 0.05)")] = Field(
        0.0, ge=0, description="training only: uniform noise in [-w, w] added to the verifier's target-layer hidden "
        "states before the drafter reads them (the peer's DFlash recipe uses 0.05)",
    )
    gamma: Optional[float] = Field(None, gt=0, description="None: 7 for B=16, 5 for 10, 4 for 8")
    # plain DFlash has no Markov or confidence head; the DSpark kind's section overrides both
    markov_rank: int = 0
    confidence_head: StrictBool = False
    loss: BlockLossConfig = BlockLossConfig()
    decode_prompts: int = Field(
        4, ge=0, description="validation prompts greedily decoded with the drafter at every validation (real tau)",
    )
    cache_verifier_outputs: StrictBool = Field(
        False, description="keep each batch's verifier outputs (target-layer hidden states, argmax; logits too for "
        "fkl) after its first forward and reuse them every later epoch: exact, and saves the frozen forward per "
        "step; costs T·(num_feature_layers·hidden + 1) floats per corpus row (T·vocab more with fkl) of memory; "
        "online only: offline the stored features already are that cache",
    )
    features: VerifierFeatures = "offline"
    trainer: BlockTrainerConfig = BlockTrainerConfig()

    @property
    def draft_tokens(self) -> int:
        """k per verifier step as served (`num_speculative_tokens`): the block less its anchor position."""
        return self.block_size - 1


class BlockDrafterConfig(BlockFamilyConfig):
    """`train.block`: the DFlash-style block drafter, every block position drafted independently in one pass."""

    kind: ClassVar[str] = "block"

    @model_validator(mode="before")
    @classmethod
    def _no_dspark_heads(cls, data):
        # one kind, one served layout: a Markov or confidence head makes it the DSpark kind, trained beside this one
        if isinstance(data, dict) and (data.get("markov_rank") or data.get("confidence_head")):
            raise ValueError("markov_rank / confidence_head are the DSpark kind's: set them under train.dspark "
                             "(trained beside the plain block drafter), not train.block")
        return data


def check_target_layers(params, kind: str) -> None:
    """Caught at params load instead of minutes later in training, when the verifier's depth is known now."""
    layer_ids = getattr(params.train, kind).target_layer_ids
    if layer_ids is None:
        return
    if len(set(layer_ids)) != len(layer_ids) or min(layer_ids) < 0:
        raise ValueError(f"train.{kind}.target_layer_ids {layer_ids} must be distinct layer indices >= 0")
    depth = params.verifier.bootstrap.num_layers
    if params.verifier.source == "bootstrap" and max(layer_ids) >= depth:
        raise ValueError(
            f"train.{kind}.target_layer_ids {layer_ids} out of range for the {depth}-layer bootstrap verifier "
            f"(valid: 0..{depth - 1})"
        )


@cross_check("train", "verifier")
def _block_target_layers_exist(params) -> None:
    check_target_layers(params, BlockDrafterConfig.kind)


def build_target_layer_ids(num_verifier_layers: int, count: int) -> list[int]:
    """`count` verifier layers spread uniformly from the 2nd to the 3rd-from-last (0-based layer ids).

    The rule of z-lab/dflash (a single layer: the middle one), with duplicates dropped so a shallow
    verifier gets fewer, distinct layers. Layer id i is `hidden_states[i + 1]` (index 0 is the embeddings).
    """
    if num_verifier_layers < 1 or count < 1:
        raise ValueError(f"need >= 1 verifier layer and >= 1 selected layer, got {num_verifier_layers}, {count}")
    start, end = 1, num_verifier_layers - 3
    if count == 1 or end <= start:
        return [num_verifier_layers // 2]
    span = end - start
    ids = [int(round(start + i * span / (count - 1))) for i in range(count)]
    return sorted(set(ids))


def target_layer_ids(cfg: BlockFamilyConfig, depth: int) -> list[int]:
    """The verifier layers feeding the drafter: params' own, or `num_feature_layers` spread over `depth`."""
    layer_ids = cfg.target_layer_ids or build_target_layer_ids(depth, cfg.num_feature_layers)
    if any(not 0 <= layer_id < depth for layer_id in layer_ids):
        raise DraftlineError(f"train.{cfg.kind}.target_layer_ids {layer_ids} out of range for a {depth}-layer verifier; "
                             f"use ids in 0..{depth - 1} or null for the default spread")
    return layer_ids


def feature_layers(cfg: BlockFamilyConfig, depth: int) -> set[int]:
    """The verifier `hidden_states` indices the drafter reads (layer id i is index i + 1): what extract_features
    stores for it (pipeline/features/store.py)."""
    return {layer_id + 1 for layer_id in target_layer_ids(cfg, depth)}
