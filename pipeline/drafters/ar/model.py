"""The AR drafter's model: a small standard Qwen3/Llama causal LM on the verifier's tokenizer.

Being a plain HF model is the point: vLLM, SGLang and TensorRT-LLM load it as a draft model as is.
Drafts are verified id by id, so a drafter whose vocabulary differs from the verifier's is refused.

Design: docs/algorithms.md#ar-drafter.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from pipeline.drafters.ar.config import ARDrafterConfig
from pipeline.errors import DraftlineError
from pipeline.integrity import check_same_tokenizer, load_pretrained, load_tokenizer, require_checkpoint

_ARCHITECTURES = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}


def drafter_config(verifier: PreTrainedModel, cfg: ARDrafterConfig, tokenizer: PreTrainedTokenizerBase):
    """Shape from params; vocabulary, positions, RoPE and special ids from the verifier."""
    vc = verifier.config
    hidden = cfg.hidden_size or vc.hidden_size
    head_dim = cfg.head_dim or (getattr(vc, "head_dim", None) if hidden == vc.hidden_size else None) or hidden // cfg.num_heads
    config_class, _ = _ARCHITECTURES[cfg.architecture]
    return config_class(
        vocab_size=vc.vocab_size,
        hidden_size=hidden,
        intermediate_size=cfg.intermediate_size or (vc.intermediate_size if hidden == vc.hidden_size else 3 * hidden),
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=vc.max_position_embeddings,
        rms_norm_eps=getattr(vc, "rms_norm_eps", 1e-6),
        rope_parameters=getattr(vc, "rope_parameters", None),
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=getattr(vc, "bos_token_id", None),
    )


def build_drafter(
    verifier: PreTrainedModel, cfg: ARDrafterConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0
) -> PreTrainedModel:
    """A fresh drafter (init `verifier`/`scratch`) or one loaded from `init_path` (init `pretrained`)."""
    if cfg.init == "pretrained":
        return load_pretrained_drafter(cfg.init_path, verifier, tokenizer)
    torch.manual_seed(seed)
    _, model_class = _ARCHITECTURES[cfg.architecture]
    drafter = model_class(drafter_config(verifier, cfg, tokenizer))
    if cfg.init == "verifier":
        copy_verifier_embeddings(drafter, verifier)
    return drafter


def copy_verifier_embeddings(drafter: PreTrainedModel, verifier: PreTrainedModel) -> bool:
    """Start from the verifier's embeddings, LM head and final norm when the widths match; else keep them learned."""
    if drafter.config.hidden_size != verifier.config.hidden_size:
        return False
    with torch.no_grad():
        drafter.get_input_embeddings().weight.copy_(verifier.get_input_embeddings().weight)
        drafter.get_output_embeddings().weight.copy_(verifier.get_output_embeddings().weight)
        drafter_norm, verifier_norm = getattr(drafter.model, "norm", None), getattr(verifier.model, "norm", None)
        if drafter_norm is not None and verifier_norm is not None:
            drafter_norm.weight.copy_(verifier_norm.weight)
    return True


def load_pretrained_drafter(
    path: str, verifier: PreTrainedModel, verifier_tokenizer: PreTrainedTokenizerBase
) -> PreTrainedModel:
    """A local HF causal LM to start from; refused unless its tokenizer and vocabulary are the verifier's."""
    what = f"train.ar.init_path '{path}'"
    fix = "point it at a local HF causal LM dir with a tokenizer or set train.ar.init to 'verifier'"
    tokenizer = load_tokenizer(Path(path), what, fix)
    model = load_pretrained(AutoModelForCausalLM.from_pretrained, Path(path), what, fix, use_safetensors=True)
    check_same_tokenizer(verifier_tokenizer, tokenizer, f"AR drafter init model '{path}'")
    check_same_vocabulary(model, verifier, f"AR drafter init model '{path}'")
    return model


def check_same_vocabulary(drafter: PreTrainedModel, verifier: PreTrainedModel, what: str) -> None:
    """Logit rows must line up with the verifier's for distillation and id-by-id verification."""
    ours, theirs = drafter.config.vocab_size, verifier.config.vocab_size
    if ours != theirs:
        raise DraftlineError(
            f"{what}: vocabulary size {ours} differs from the verifier's {theirs}; "
            "use a drafter built on the verifier's tokenizer"
        )


def load_drafter(path: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A trained (or exported) AR drafter, frozen, for decoding and export."""
    require_checkpoint(path, "ar")
    model = load_pretrained(AutoModelForCausalLM.from_pretrained, path, f"AR drafter at {path}",
                            "retrain it (`dvc repro train_ar`)", use_safetensors=True, dtype=dtype)
    return model.eval().requires_grad_(False)
