"""The README is for users and short; the docs describe the code as it is, not how it got there.

- README.md stays within `README_MAX_LINES`: what draftline is, the commands, the pipeline, your own
  verifier, scaling out, one results table, where the docs are; everything else is a page of docs/.
- No page tells history ("used to", "not re-measured", ...): a page says what the code does now. A
  measurement carries its date and commit, and only the results page holds dated measurements.
Links and anchors between the pages are checked by tests/test_no_stale_pointers.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
RESULTS_PAGE = "docs/results.md"
HISTORY = re.compile(
    r"\bused to\b|\bnot re-measured\b|\bre-measured since\b|\b(?:earlier|previous|this) sessions?\b"
    r"|\bpredates?\b|\bbefore this version\b|\bin the run before\b",
    re.IGNORECASE)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def pages() -> list[str]:
    return ["README.md"] + sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))


def history_problems(name: str, text: str) -> list[str]:
    """Every line of a page that tells history, or dates a run outside the results page."""
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        if found := HISTORY.search(line):
            problems.append(f"{name}:{number}: tells history ({found.group(0)!r}): say what the code does now")
        if name != RESULTS_PAGE and (found := DATE.search(line)):
            problems.append(f"{name}:{number}: a dated run ({found.group(0)}) belongs in {RESULTS_PAGE}")
    return problems


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_no_page_tells_history():
    problems = [problem for name in pages()
                for problem in history_problems(name, (ROOT / name).read_text(encoding="utf-8"))]
    assert not problems, "\n".join(problems)


def test_the_results_page_dates_its_measurements():
    assert DATE.search((ROOT / RESULTS_PAGE).read_text(encoding="utf-8")), f"{RESULTS_PAGE} dates no measurement"


@pytest.mark.parametrize("line", [
    "serve_check used to start its engines at the edge",
    "(Not re-measured on the trained demo drafter)",
    "these numbers predate this version",
    "measured in an earlier session",
    "One `make demo` from a fresh clone (2026-12-04)",
])
def test_a_planted_history_line_is_caught(line):
    assert history_problems("docs/serving.md", line + "\n")


def test_the_results_page_may_date_a_run_but_not_tell_history():
    assert history_problems(RESULTS_PAGE, "Commit `8d7a988`, 2026-12-04: one `make demo`\n") == []
    assert history_problems(RESULTS_PAGE, "the numbers that used to be here\n")
