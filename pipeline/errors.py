"""User-facing errors: the CLI prints them as one line and exits non-zero, without a traceback."""

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
