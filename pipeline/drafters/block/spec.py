"""The block kind as the registry lists it (pipeline/drafters/registry.py), with the
τ-vs-steps plot its training writes (pipeline/drafters/block/training.py: `write_tau_plot`); imports none of its code."""

from __future__ import annotations

from pipeline.drafters.kind_spec import KindSpec

BLOCK = KindSpec(
    package=__package__,
    config_class="BlockDrafterConfig",
    feature_params=("target_layer_ids", "num_feature_layers"),
    train_plots=(
        ("train_block_tau.csv", {"cache": False, "x": "step", "y": "decode_tau",
                                 "title": "block drafter greedy-decode tau during training (prefill included)"}),
        ("train_block_tau.png", {"cache": False}),
    ),
)
