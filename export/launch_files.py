"""The served copy of a drafter and its launch files (each kind's `serving.py` says what goes in them).

`serving/` is the checkpoint as serving stacks load it, `launch.md` the vLLM / SGLang / TensorRT-LLM
commands with the real paths, `vllm.json` the vLLM job that launch.md shows and stage `serve_check`
runs verbatim.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.drafters.interface import Launch
from pipeline.errors import DraftlineError

SERVING_DIR = "serving"
LAUNCH_NAME = "launch.md"
NOT_SERVED = ("training.json",)  # training records stay in the drafter artifact (lineage is in the manifest)
VLLM_NAME = "vllm.json"  # {"model": verifier, "speculative_config": {...}}: what launch.md tells vLLM users


def copy_checkpoint(drafter_dir: Path, serving_dir: Path) -> None:
    if not (drafter_dir / "config.json").is_file():
        raise DraftlineError(f"no drafter checkpoint at {drafter_dir}; run `dvc repro train_{drafter_dir.name}`")
    serving_dir.mkdir(parents=True, exist_ok=True)
    for item in sorted(drafter_dir.iterdir()):
        if item.name in NOT_SERVED or item.name.startswith("."):
            continue
        if item.is_dir():
            shutil.copytree(item, serving_dir / item.name)
        else:
            shutil.copy2(item, serving_dir / item.name)


def vllm_job(verifier: str, launch: Launch) -> dict:
    return {"model": verifier, "speculative_config": launch.speculative_config}
