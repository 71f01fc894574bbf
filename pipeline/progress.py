"""Progress bars and end-of-step summaries, one look for every stage.

Bars are tqdm, like Lightning's training bars; tables and messages are rich. In a log file (stderr not a
terminal) a bar writes one line per `LOG_INTERVAL_S` instead of redrawing, so `make demo > log` stays short.
Progress, summaries and messages go to stderr; what a command was asked to print (`registry list`, the text
`generate` writes) is data and goes to stdout (`print_data`), so `| grep` and `> file` get it.
"""

from __future__ import annotations

import sys
from typing import Iterable, Mapping, TypeVar

from rich.console import Console, RenderableType
from rich.table import Table
from tqdm.auto import tqdm

T = TypeVar("T")

console = Console(stderr=True, highlight=False)
LOG_INTERVAL_S = 30.0


class Bar(tqdm):
    """A tqdm bar whose postfix updates wait for its own print interval (tqdm redraws on each by default)."""

    def set_postfix(self, ordered_dict=None, refresh: bool = False, **kwargs) -> None:
        super().set_postfix(ordered_dict, refresh, **kwargs)


def progress(iterable: Iterable[T] | None = None, *, desc: str, total: int | None = None, unit: str = "it") -> Bar:
    interval = 0.1 if sys.stderr.isatty() else LOG_INTERVAL_S
    return Bar(iterable, desc=desc, total=total, unit=unit, dynamic_ncols=True, file=sys.stderr, leave=True,
                mininterval=interval, maxinterval=max(interval, 10.0))


def close_progress_bars() -> None:
    """Finish every bar still open: a step that raised never closed its own, and the bar would otherwise
    redraw itself after the stage's error line, at exit."""
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def print_summary(title: str, rows: Mapping[str, object]) -> None:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in rows.items():
        table.add_row(str(key), f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)


def print_data(renderable: RenderableType, soft_wrap: bool = False) -> None:
    """To stdout, never cut: a table at its full width (names are what a user copies, and a pipe would
    get 80 columns), text unwrapped with `soft_wrap`."""
    stdout = Console(highlight=False)
    wanted = stdout.measure(renderable, options=stdout.options.update_width(10_000)).maximum
    Console(highlight=False, width=max(stdout.width, wanted)).print(renderable, soft_wrap=soft_wrap)


def print_columns(rows: list[tuple[str, ...]]) -> None:
    """Rows of cells (the first the header) to stdout, each column padded to its widest cell: a table that is the
    command's data, which a pipe or a redirect gets whole (rich would wrap it to the terminal)."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def info(message: str) -> None:
    console.print(message)


def warn(message: str) -> None:
    """One `draftline: warning: ...` line, the form `params check` uses."""
    print(f"draftline: warning: {message}", file=sys.stderr)
