"""Text every Python install has: the standard library's source (code) and its documentation (prose).

Deterministic: files are visited in sorted order and the caps are applied in that order, so the same
Python version always yields the same texts.
"""

from __future__ import annotations

import ast
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

# Tests, demos and vendored trees are noisy or huge; the rest of the stdlib is plenty.
_SKIP_PARTS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "ensurepip",
               "turtledemo", "__pycache__", "pydoc_data"}
_MAX_FILE_CHARS = 200_000


@dataclass(frozen=True)
class StdlibTexts:
    code: list[str]  # module sources
    prose: list[str]  # documentation paragraphs (pydoc topics + docstrings)

    @property
    def chars(self) -> int:
        return sum(map(len, self.code)) + sum(map(len, self.prose))


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_source_files() -> list[Path]:
    root = stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts[:-1])
        if parts & _SKIP_PARTS or path.name.startswith("test_"):
            continue
        files.append(path)
    return files


def read_source(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    return text if 0 < len(text) <= _MAX_FILE_CHARS else None


def paragraphs(text: str, min_chars: int = 80) -> list[str]:
    """Blank-line separated paragraphs with their internal whitespace collapsed."""
    result = []
    for block in text.split("\n\n"):
        joined = " ".join(block.split())
        if len(joined) >= min_chars:
            result.append(joined)
    return result


def pydoc_topic_paragraphs() -> list[str]:
    from pydoc_data.topics import topics

    result = []
    for name in sorted(topics):
        result.extend(paragraphs(topics[name]))
    return result


def docstrings(source: str) -> Iterator[str]:
    """Module, class and function docstrings of one source file, in file order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    nodes.sort(key=lambda node: getattr(node, "lineno", 0))
    for node in nodes:
        doc = ast.get_docstring(node)
        if doc:
            yield doc


def _take(items: Iterator[str] | list[str], budget: int) -> list[str]:
    taken, used = [], 0
    for item in items:
        if used + len(item) > budget:
            break
        taken.append(item)
        used += len(item)
    return taken


def collect_stdlib_texts(max_corpus_chars: int, code_fraction: float = 0.6) -> StdlibTexts:
    """Source files and documentation paragraphs, capped at `max_corpus_chars` in total.

    Both budgets are filled round-robin across the sorted files so a small cap still covers many
    modules instead of the first few alphabetically.
    """
    sources = [text for text in map(read_source, stdlib_source_files()) if text]
    code = _take(_round_robin_prefixes(sources, 8_000), int(max_corpus_chars * code_fraction))
    prose_budget = max_corpus_chars - sum(map(len, code))
    prose_pool = pydoc_topic_paragraphs()
    for source in sources:  # parsing is the slow part: stop once the pool can fill the budget
        if sum(map(len, prose_pool)) >= prose_budget:
            break
        prose_pool.extend(p for doc in docstrings(source) for p in paragraphs(doc, min_chars=60))
    prose = _take(_interleave(prose_pool, 7), prose_budget)
    return StdlibTexts(code=code, prose=prose)


def _round_robin_prefixes(sources: list[str], chunk: int) -> Iterator[str]:
    """Chunk `chunk` of every file in turn (cut at line boundaries), then chunk 2 of every file, ..."""
    chunked = [_line_chunks(source, chunk) for source in sources]
    depth = max(map(len, chunked), default=0)
    for level in range(depth):
        for chunks in chunked:
            if level < len(chunks):
                yield chunks[level]


def _line_chunks(text: str, size: int) -> list[str]:
    chunks, current, length = [], [], 0
    for line in text.splitlines(keepends=True):
        current.append(line)
        length += len(line)
        if length >= size:
            chunks.append("".join(current))
            current, length = [], 0
    if current:
        chunks.append("".join(current))
    return chunks


def _interleave(items: list[str], stride: int) -> list[str]:
    """A fixed permutation that spreads neighbouring paragraphs (same module/topic) apart."""
    return [items[i] for start in range(stride) for i in range(start, len(items), stride)]
