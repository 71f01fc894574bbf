"""The DSpark kind as the registry lists it (pipeline/drafters/registry.py); imports none of its code."""

from __future__ import annotations

from pipeline.drafters.block.spec import family_spec

DSPARK = family_spec(__package__, "DSparkDrafterConfig")
