"""The served copy of a drafter and its launch files (each kind's `serving.py` says what goes in them).

`serving/` is the checkpoint as serving stacks load it, `launch.md` the vLLM / SGLang / TensorRT-LLM
commands with the real paths (for pasting), `vllm.json` the vLLM job that launch.md shows and stage
`serve_check` runs. vLLM.json names the files inside the artifacts dir relative to the export dir, so a
copied or moved project serves its own files, never the ones the paths pointed at when it was exported.
"""

from __future__ import annotations

import os
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


def _relative(location: str, export_dir: Path, artifacts: Path) -> str:
    """A path under `artifacts` as seen from `export_dir`; anything else (an external verifier dir, an HF
    model name) as it is."""
    path = Path(location)
    if path.is_absolute() and path.is_relative_to(artifacts.resolve()):
        relative = os.path.relpath(path, export_dir.resolve())
        return relative if relative.startswith("..") else f"./{relative}"  # "./": a path, never an HF model name
    return location


def relocatable_job(job: dict, export_dir: Path, artifacts: Path) -> dict:
    """`job` as vllm.json stores it: the verifier and draft dirs inside the artifacts dir relative to `export_dir`."""
    speculative = job["speculative_config"]
    return {"model": _relative(job["model"], export_dir, artifacts),
            "speculative_config": {**speculative, "model": _relative(speculative["model"], export_dir, artifacts)}}


def _resolved(location: object, export_dir: Path) -> object:
    if not isinstance(location, str) or not location.startswith(("./", "../")):
        return location  # absolute, an HF model name, or not a path at all (checked where it is used)
    return str((export_dir / location).resolve())


def resolved_job(job: dict, export_dir: Path) -> dict:
    """vllm.json's job with its relative paths filled in for where the export dir is now."""
    speculative = job.get("speculative_config")
    resolved = {**job, "model": _resolved(job.get("model"), export_dir)}
    if isinstance(speculative, dict):
        resolved["speculative_config"] = {**speculative, "model": _resolved(speculative.get("model"), export_dir)}
    return resolved
