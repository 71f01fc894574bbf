"""The block drafter's training blocks: random anchors drawn from padded (prompt + response) batches
(pipeline/training/prompt_response_data.py), and each block's inputs and labels.

Anchors are response positions (at serving time the anchor is always a token the verifier produced):
a in [prompt_len, length − 2], so every block has at least one label (`prompt_anchors` widens training's
range to [1, length − 2]: more blocks from a small corpus). With `anchors_per_sequence: all` every such
position anchors a block (all in one pass, as the references do for short sequences); a number draws
that many per step from a generator seeded by (seed, step, rank), which re-samples them every epoch, keeps
runs reproducible and resumable, and gives validation a fixed set (seeded by the batch index).
"""

from __future__ import annotations

import torch
from torch import Tensor


def sample_anchors(
    first: Tensor, lengths: Tensor, per_sequence: int | str, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Anchors per row from [first, length − 2] (`first`: the prompt length, for response anchors),
    sorted: all of them (`per_sequence="all"`) or up to `per_sequence` distinct ones drawn with `generator`.

    Returns anchors (B, N) and anchor_valid (B, N); rows with fewer candidates pad with invalid
    anchors at position 0 (they carry no labels and see no context).
    """
    candidates = (lengths - 1 - first).clamp(min=0)
    if per_sequence == "all":
        width = max(1, int(candidates.max()))
        offsets = torch.arange(width)[None]
        valid = offsets < candidates[:, None]
        return torch.where(valid, first[:, None] + offsets, torch.zeros_like(offsets)), valid
    batch = first.shape[0]
    anchors = torch.zeros((batch, per_sequence), dtype=torch.long)
    valid = torch.zeros((batch, per_sequence), dtype=torch.bool)
    for row in range(batch):
        count = int(candidates[row])
        if count <= 0:
            continue
        take = min(per_sequence, count)
        picked = torch.randperm(count, generator=generator)[:take].sort().values + int(first[row])
        anchors[row, :take] = picked
        valid[row, :take] = True
    return anchors, valid


def block_targets(
    input_ids: Tensor, lengths: Tensor, anchors: Tensor, anchor_valid: Tensor, block_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Block inputs (B, N, L): the anchor token then its (masked) continuation; labels (B, N, L−1) are the
    tokens at anchor+1..anchor+L−1 with label_valid (B, N, L−1) false past the sequence end."""
    offsets = torch.arange(block_size, device=input_ids.device)
    positions = anchors[..., None] + offsets  # (B, N, L)
    in_range = positions < lengths[:, None, None]
    gathered = torch.gather(
        input_ids, 1, positions.clamp(max=input_ids.shape[1] - 1).flatten(1)
    ).view_as(positions)
    tokens = torch.where(in_range, gathered, torch.zeros_like(gathered))
    label_valid = in_range[..., 1:] & anchor_valid[..., None]
    return tokens, tokens[..., 1:], label_valid
