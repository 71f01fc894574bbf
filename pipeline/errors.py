"""User-facing errors: the CLI prints them as one line and exits non-zero, without a traceback."""

import errno
import signal
import urllib.parse


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


def describe_os_error(error: OSError) -> str:
    """An OSError that escaped a stage as one line that names the file and what to do about it."""
    where = error.filename if error.filename is not None else "standard output"
    reason = error.strerror or type(error).__name__
    if error.errno == errno.ENOSPC:
        return f"no space left on the disk holding {where} ({reason}); free space there (`df -h`) and rerun"
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {where} ({reason}); make it writable (or point project dirs elsewhere) and rerun"
    if error.errno == errno.ENOTDIR:
        return f"{where}: part of this path is a file, not a directory ({reason}); remove or move that file"
    return f"{where}: {reason}"
