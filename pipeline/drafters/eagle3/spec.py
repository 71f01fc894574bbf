"""The EAGLE-3 kind as the registry lists it (pipeline/drafters/registry.py); imports none of its code."""

from __future__ import annotations

from pipeline.drafters.kind_spec import KindSpec

EAGLE3 = KindSpec(package=__package__, config_class="Eagle3DrafterConfig", feature_params=("aux_layer_ids",))
