"""Read audit for tests/pipeline/test_stage_data_deps.py, loaded at start-up by every Python process whose
PYTHONPATH starts with this folder (so also a stage's worker processes): when $DRAFTLINE_READ_LOG is set,
it appends to that file each path the process opens for reading, lists, or opens as an SQLite database,
one `<event>\t<absolute path>` a line. Files opened to be created or written are not reads and are left out."""

import os
import sys

_LOG = os.environ.get("DRAFTLINE_READ_LOG")


def _opened_for_reading(mode: object, flags: int) -> bool:
    if isinstance(mode, str):  # open() / io.open(): "r", "rb", "r+"; "w", "a", "x" create or write
        return mode.startswith("r")
    return not flags & os.O_CREAT and flags & os.O_ACCMODE != os.O_WRONLY  # os.open()


def _read_path(event: str, args: tuple) -> object:
    """The path an audit event reads, or None."""
    if event == "open":
        return args[0] if _opened_for_reading(args[1], args[2]) else None
    if event in ("os.listdir", "os.scandir"):
        return args[0]
    if event == "sqlite3.connect" and isinstance(args[0], str):  # a path or a URI: `file:/x/mlflow.db?mode=ro`
        return args[0].removeprefix("file:").split("?")[0]
    return None


if _LOG:
    _out = open(_LOG, "a", buffering=1, encoding="utf-8")  # opened before the hook exists: not logged

    def _hook(event: str, args: tuple) -> None:
        path = _read_path(event, args)
        # a file descriptor, or None for the current directory, names no new path
        if isinstance(path, (str, bytes, os.PathLike)):
            _out.write(f"{event}\t{os.path.abspath(os.fsdecode(path))}\n")

    sys.addaudithook(_hook)
