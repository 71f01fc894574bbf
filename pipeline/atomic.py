"""Atomic outputs: write next to the target, then rename, so a crash never leaves a partial artifact."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def _umask_mode(mode: int) -> int:
    """mkstemp/mkdtemp create private (0600/0700) entries; artifacts get the usual umask-based mode."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _umask_mode(0o666))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def save_figure_atomic(figure, path: str | os.PathLike) -> Path:
    """A matplotlib figure as PNG, written next to `path` and renamed into place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".png")
    os.close(fd)
    try:
        figure.savefig(tmp, dpi=110, bbox_inches="tight")
        os.chmod(tmp, _umask_mode(0o666))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _make_readable(directory: Path) -> None:
    """Writers inside the directory (safetensors, ONNX external data) may create private 0600 files;
    a serving process running as another user must be able to read the artifact."""
    file_mode, dir_mode = _umask_mode(0o666), _umask_mode(0o777)
    for entry in directory.rglob("*"):
        if not entry.is_symlink():
            os.chmod(entry, dir_mode if entry.is_dir() else file_mode)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A writer killed by SIGKILL leaves its temporary dir; outputs have one writer (DVC locks the
    # stage), so any such dir is garbage by the time the next write of this output starts.
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    os.chmod(tmp, _umask_mode(0o777))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _make_readable(tmp)
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
