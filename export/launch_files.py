"""The served copy of a drafter and its launch files (each kind's `serving.py` says what goes in them).

`serving/` is the checkpoint as serving stacks load it, `launch.md` the vLLM / SGLang / TensorRT-LLM /
llama.cpp commands with the real paths (for pasting), `vllm.json` the vLLM job that launch.md shows and stage
`serve_check` runs. vLLM.json names the files inside the artifacts dir relative to the export dir, so a
copied or moved project serves its own files, never the ones the paths pointed at when it was exported.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from export import gguf_files
from pipeline.drafters.interface import Launch
from pipeline.errors import DraftlineError
from pipeline.llamacpp_launch import command_line, server_arguments

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


def llamacpp_arguments(kind: str, launch: Launch, export_dir: Path) -> list[str]:
    """launch.md's llama-server arguments for the drafter exported to `export_dir` (absolute paths)."""
    root = export_dir.resolve()
    return server_arguments(str(root.parent / gguf_files.VERIFIER_GGUF), str(root / gguf_files.drafter_gguf(kind)),
                            launch.llama_spec_type, int(launch.speculative_config["num_speculative_tokens"]))


def llamacpp_section(kind: str, launch: Launch, export_dir: Path, verifier: str, skip_reason: str | None) -> str:
    """launch.md's llama.cpp part: the GGUF files and the `llama-server` command."""
    if skip_reason:
        return f"## llama.cpp\n\nNo GGUF files were written: {skip_reason}.\n"
    q8 = export_dir.resolve() / gguf_files.drafter_gguf(kind, "q8_0")
    return f"""## llama.cpp (`llama-server`)

GGUF files written by llama.cpp's own `convert_hf_to_gguf.py` (from the {gguf_files.converter_pin()} sdist) from
`serving/`, checked with llama.cpp's server from {gguf_files.runtime_pin()} (docs/serving.md#llamacpp: converter
and runtime are pinned together; each version ends in its llama.cpp build number). `-md` is the drafter as
trained (f32); `{q8}` is the same drafter in Q8_0. `-m` is `{verifier}` converted
for this check (f32); with your own verifier, convert it with the same llama.cpp build.

```bash
{command_line(llamacpp_arguments(kind, launch, export_dir))}
```

On a GPU build of llama.cpp (CUDA, ROCm, Vulkan, Metal) the same files and flags work; layers go to the GPU
as they fit (`-ngl auto`, the default), and `-ngl all -ngld all` puts every verifier and drafter layer there
(`--spec-draft-device` picks the drafter's device).
"""
