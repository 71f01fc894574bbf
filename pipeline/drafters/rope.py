"""Rotary position embeddings at absolute positions, as the HF Qwen3 / Llama layers apply them (the
drafters' own attention layers use them so their K/V caches can hold positions explicitly)."""

from __future__ import annotations

import torch
from torch import Tensor


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(B, T) absolute positions -> cos, sin of shape (B, 1, T, head_dim) (HF half-split convention)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat([freqs, freqs], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
