"""`manifest.json`: what an export directory holds and where it came from.

Every file with its sha256 (the GGUF files included), the ONNX I/O contract (names, shapes, dtypes, opset), the tokenizer and
verifier hashes a consumer must match, lineage, and what was skipped and why.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.drafters.onnx_io import MANIFEST_NAME
from pipeline.drafters.onnx_spec import IOSpec
from pipeline.drafters.served_checks import TOKENIZER_FILES
from pipeline.lineage import hash_file


def file_table(directory: Path) -> dict[str, dict]:
    """{relative path: {sha256, bytes}} of every file under `directory` except the manifest itself."""
    table = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = path.relative_to(directory).as_posix()
        if relative != MANIFEST_NAME:
            table[relative] = {"sha256": hash_file(path), "bytes": path.stat().st_size}
    return table


def tokenizer_hash(directory: Path) -> str:
    """sha256 over the tokenizer files a serving stack reads, in a fixed order."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        digest.update(name.encode())
        digest.update(hash_file(directory / name).encode())
    return digest.hexdigest()


def build_manifest(
    *,
    kind: str,
    out_dir: Path,
    serving_dir: Path,
    spec: IOSpec,
    opset: int,
    exporter: str,
    verifier: dict,
    lineage: dict,
    parity: dict,
    skipped: dict[str, str],
    tensorrt: dict | None,
    gguf: dict | None,
) -> dict:
    return {
        "kind": kind,
        "files": file_table(out_dir),
        "onnx": {"path": "model.onnx", "opset": opset, "exporter": exporter, **spec.to_json()},
        "tokenizer_hash": tokenizer_hash(serving_dir),
        "verifier": {"id": verifier["id"], "hash": verifier["hash"]},
        "lineage": lineage,
        "parity": {"passed": parity["passed"], "atol": parity["atol"], "rtol": parity["rtol"],
                   "outputs": parity["outputs"]},
        "tensorrt": tensorrt,
        "gguf": gguf,
        "skipped": skipped,
    }
