"""Content hashes and provenance recorded in every artifact."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path


def hash_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def hash_dir(path: Path, exclude: tuple[str, ...] = ()) -> str:
    """sha256 over (relative path, content hash) of every file, in sorted order."""
    path = Path(path)
    if path.is_file():
        return hash_file(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path).as_posix()
        if any(relative == name or relative.startswith(name + "/") for name in exclude):
            continue
        digest.update(relative.encode())
        digest.update(hash_file(file).encode())
    return digest.hexdigest()


def git_commit(cwd: Path | str = ".") -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
