"""The block kind as the registry lists it (pipeline/drafters/registry.py), with the
τ-vs-steps plot its training writes (pipeline/drafters/block/training.py: `write_tau_plot`); imports none of its code.
The DSpark kind (pipeline/drafters/dspark/) is of the same family and is listed by the same rule."""

from __future__ import annotations

from pipeline.drafters.kind_spec import KindSpec


def family_spec(package: str, config_class: str) -> KindSpec:
    """A block-family kind: its package, its `train.<kind>` class, its τ-vs-steps plot `train_<kind>_tau`."""
    name = package.rpartition(".")[2]
    return KindSpec(
        package=package,
        config_class=config_class,
        feature_params=("target_layer_ids", "num_feature_layers"),
        train_plots=(
            (f"train_{name}_tau.csv", {"cache": False, "x": "step", "y": "decode_tau",
                                       "title": f"{name} drafter greedy-decode tau during training (prefill included)"}),
            (f"train_{name}_tau.png", {"cache": False}),
        ),
    )


BLOCK = family_spec(__package__, "BlockDrafterConfig")
