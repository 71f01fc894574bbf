"""The AR kind as the registry lists it (pipeline/drafters/registry.py); imports none of its code."""

from __future__ import annotations

from pipeline.drafters.kind_spec import KindSpec

AR = KindSpec(package=__package__, config_class="ARDrafterConfig")
