import os

import pytest

from pipeline.atomic import atomic_dir, write_json_atomic


def test_failed_atomic_dir_keeps_the_previous_output_and_no_temp(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "a.txt").write_text("half-written")
            raise RuntimeError("crash mid-stage")
    assert (target / "a.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_dir_replaces_old_contents(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        (tmp / "old.txt").write_text("x")
    with atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("y")
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert oct(target.stat().st_mode & 0o777) != oct(0o700)


def test_write_json_atomic_is_readable_by_others(tmp_path):
    path = write_json_atomic(tmp_path / "m.json", {"a": 1})
    assert path.read_text().strip().startswith("{")
    assert path.stat().st_mode & 0o044


def test_atomic_dir_makes_private_files_readable(tmp_path):
    """safetensors/ONNX writers may create 0600 files; a serving user must still read the artifact."""
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        private = tmp / "model.safetensors"
        private.write_bytes(b"x")
        private.chmod(0o600)
        (tmp / "sub").mkdir(mode=0o700)
    old_umask = os.umask(0o022)
    os.umask(old_umask)
    assert (target / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~old_umask
    assert (target / "sub").stat().st_mode & 0o777 == 0o777 & ~old_umask
