"""User-facing errors: the CLI prints them as one line and exits non-zero, without a traceback."""


class DraftlineError(Exception):
    """A problem the user can fix (bad input, missing artifact). Exit code 1 unless overridden."""

    exit_code = 1


class ParamsError(DraftlineError):
    """`params.yaml` failed validation. Exit code 2, like argparse usage errors."""

    exit_code = 2
