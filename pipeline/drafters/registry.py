"""Every drafter kind: the one list. A new kind is its package under pipeline/drafters/ (with `spec.py`,
`config.py`, `kind.py`, `training.py`) and its entry here; the accepted kind names, the `train.<kind>`
params sections, CLI choices and dvc.yaml (`python -m pipeline.dvc_pipeline`) follow from this list.

Light on purpose: pipeline/config/base.py takes the kind names from it, and every stage and `draftline
--help` load that first, so it imports each kind's `spec.py` only (no pydantic model, no torch). A kind's
other parts load by name where they are used (`KindSpec.module`): its `config` where the `train` section is
built (pipeline/config/train_config.py), its `kind` in `pipeline.drafters.kinds.KINDS`, its `training` in
train/dispatch.py for the one kind trained. So editing a kind's code reruns only the stages that run it
(dvc.yaml: pipeline/dvc_pipeline.py), and the config <-> kinds import cycle never forms.
"""

from __future__ import annotations

from pipeline.drafters.ar.spec import AR
from pipeline.drafters.block.spec import BLOCK
from pipeline.drafters.dspark.spec import DSPARK
from pipeline.drafters.eagle3.spec import EAGLE3
from pipeline.drafters.kind_spec import KindSpec

KIND_SPECS: dict[str, KindSpec] = {spec.name: spec for spec in (AR, BLOCK, DSPARK, EAGLE3)}
