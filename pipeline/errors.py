"""User-facing errors: the CLI prints them as one line and exits non-zero, without a traceback."""

import errno
import os
import re
import shutil
import signal
import urllib.parse
from pathlib import Path


class DraftlineError(Exception):
    """A problem the user can fix (bad input, missing artifact). Exit code 1 unless overridden."""

    exit_code = 1


class ParamsError(DraftlineError):
    """`params.yaml` failed validation. Exit code 2, like argparse usage errors."""

    exit_code = 2


def redact_url(url: str) -> str:
    """`url` for a message: credentials in it (`user:token@host`) must never reach a terminal or a log."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.username is None and parts.password is None:
            return url
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "<a URL with credentials>"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"***@{host}"))


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP), raised where it lands: cleanup written for Ctrl-C runs for it too, and the CLI
    exits 128 + the signal (143 for SIGTERM) rather than Ctrl-C's 130, so a supervisor sees which one
    stopped the stage."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.signum = int(signum)


# torch.save's C++ writer on a failed write (a full disk, seen as "unexpected pos 576 vs 534"): it drops the errno
TORCH_WRITER_FAILED = re.compile(r"inline_container\.cc.*(unexpected pos|failed writing)|PytorchStreamWriter failed writing")


def os_error_behind(error: BaseException | None, where: str | os.PathLike | None = None) -> OSError | None:
    """The OSError behind a library's own exception type: in its cause/context chain, or rebuilt from a message
    that reports it only in words (safetensors: "I/O error: No space left on device (os error 28)"; C++ writers:
    "No space left on device"). `where` names the file when the error does not."""
    walked: set[int] = set()
    while error is not None and id(error) not in walked:
        walked.add(id(error))
        if isinstance(error, OSError):
            if error.filename is None and where is not None:
                return OSError(error.errno, error.strerror, str(where))
            return error
        text = str(error)
        number = re.search(r"\(os error (\d+)\)", text)
        if number:
            code = int(number.group(1))
            return OSError(code, os.strerror(code), None if where is None else str(where))
        if "No space left on device" in text:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), None if where is None else str(where))
        if TORCH_WRITER_FAILED.search(text):
            return OSError(errno.EIO, "torch's file writer failed and names no cause (most often a full disk: "
                                      "check `df -h`)", None if where is None else str(where))
        error = error.__cause__ or error.__context__
    return None


def _size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"


def _free_on(where: str) -> str | None:
    """What is free on the disk holding `where` (its nearest existing directory), for a full-disk message."""
    directory = Path(where).absolute()
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    try:
        return _size(shutil.disk_usage(directory).free)
    except OSError:
        return None


def describe_os_error(error: OSError, needed: int | None = None, unnamed: str = "standard output") -> str:
    """An OSError that escaped a stage as one line that names the file and what to do about it; a full disk also
    says what is free there and, when the writer knows it (`needed` bytes), what the write needed. `unnamed`:
    what to call the file when the error names none."""
    where = error.filename if error.filename is not None else unnamed
    reason = error.strerror or type(error).__name__
    if error.errno == errno.ENOSPC:
        free = _free_on(error.filename) if error.filename is not None else None
        sizes = (f"; {free} free there" if free else "") + (f"; the write needed at least {_size(needed)}"
                                                              if needed else "")
        return f"no space left on the disk holding {where} ({reason}{sizes}); free space there (`df -h`) and rerun"
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {where} ({reason}); make it writable (or point project dirs elsewhere) and rerun"
    if error.errno == errno.ENOTDIR:
        return f"{where}: part of this path is a file, not a directory ({reason}); remove or move that file"
    return f"{where}: {reason}"
