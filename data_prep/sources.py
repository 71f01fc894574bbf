"""Prompt sources mapped to (prompt, domain), deduplicated, limited and split by prompt.

Built-in offline sources come from the standard library (`stdlib_code`: function signatures with
their docstrings and file prefixes; `stdlib_text`: documentation paragraphs). Generic sources read
local JSON/JSONL/JSONL.GZ/Parquet files or cached HF datasets through the same field mapping, so
HumanEval (`prompt`) and MT-Bench (`turns.0`) records load the same way.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from data_prep.stdlib_text import docstrings, paragraphs, pydoc_topic_paragraphs, read_source, stdlib_source_files
from pipeline.config.base import DOMAIN_PATTERN
from pipeline.config.corpus_config import CorpusConfig, PromptSourceConfig, SplitConfig
from pipeline.errors import DraftlineError
from pipeline.progress import info

FILE_PREFIX_LINES = 12
TEXT_PROMPT_CHARS = 240


@dataclass(frozen=True)
class Prompt:
    prompt: str
    domain: str  # the source's name for it: gates and limits are per domain
    source: str
    chat: bool = False  # a user turn: templated as a chat message when the verifier has a chat template


# --------------------------------------------------------------------------- built-in sources


def _signature_with_docstring(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """`def f(...):` through the end of its docstring, exactly as written (decorators excluded)."""
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)):
        return None
    text = "".join(lines[node.lineno - 1 : first.end_lineno])
    return text if text.strip() else None


def stdlib_code_prompts() -> Iterator[str]:
    for path in stdlib_source_files():
        source = read_source(path)
        if source is None:
            continue
        lines = source.splitlines(keepends=True)
        prefix = "".join(lines[:FILE_PREFIX_LINES])
        if prefix.strip():
            yield prefix
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                prompt = _signature_with_docstring(lines, node)
                if prompt:
                    yield prompt


def _text_prefix(paragraph: str) -> str:
    """The start of a paragraph, cut at a word boundary: the verifier writes the rest."""
    if len(paragraph) <= TEXT_PROMPT_CHARS:
        return paragraph
    return paragraph[:TEXT_PROMPT_CHARS].rsplit(" ", 1)[0]


def stdlib_text_prompts() -> Iterator[str]:
    for paragraph in pydoc_topic_paragraphs():
        yield _text_prefix(paragraph)
    for path in stdlib_source_files():
        source = read_source(path)
        for doc in docstrings(source) if source else ():
            for paragraph in paragraphs(doc, min_chars=120):
                yield _text_prefix(paragraph)


# --------------------------------------------------------------------------- generic sources


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        raise DraftlineError(f"prompt file {path} not found; fix corpus.sources[].path")
    if not path.is_file():  # a FIFO or device would block or stream forever
        what = "a directory" if path.is_dir() else "not a regular file (a FIFO, socket or device)"
        raise DraftlineError(f"prompt file {path} is {what}; point corpus.sources[].path at a .json/.jsonl/.parquet file")
    name = path.name.lower()
    try:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        opener = gzip.open if name.endswith(".gz") else open
        # utf-8-sig: files saved on Windows often start with a BOM, which json rejects
        with opener(path, "rt", encoding="utf-8-sig") as handle:
            if name.endswith((".jsonl", ".jsonl.gz")):
                return _jsonl_records(handle, path)
            if name.endswith((".json", ".json.gz")):
                data = json.load(handle)
                return data if isinstance(data, list) else _single_list(data, path)
    except (OSError, ValueError, EOFError) as error:
        raise DraftlineError(f"cannot read prompt file {path} ({error}); check that it is valid") from None
    except RecursionError:  # the json module recurses once per level of nesting
        raise DraftlineError(f"cannot read prompt file {path} (JSON nested too deeply); check that it is valid") from None
    raise DraftlineError(f"prompt file {path}: unsupported format; use .json, .jsonl, .jsonl.gz or .parquet")


def _jsonl_records(handle, path: Path) -> list[dict]:
    records = []
    for number, line in enumerate(handle, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError as error:  # its own position would say "line 1": the file line is what helps
            raise DraftlineError(f"prompt file {path}: line {number} is not valid JSON ({error.msg}); "
                                 "fix or remove that line") from None
        except RecursionError:
            raise DraftlineError(f"prompt file {path}: line {number} is JSON nested too deeply; "
                                 "fix or remove that line") from None
    return records


def _single_list(data: object, path: Path) -> list[dict]:
    """A JSON object holding exactly one list of records (e.g. {"data": [...]})."""
    lists = [value for value in data.values() if isinstance(value, list)] if isinstance(data, dict) else []
    if len(lists) != 1:
        raise DraftlineError(f"prompt file {path}: expected a list of records (or an object with one list)")
    return lists[0]


def field_value(record: object, field: str) -> object:
    """Follow a dotted path; integer parts index lists (`turns.0` is MT-Bench's first turn)."""
    value = record
    for part in field.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def map_records(records: Iterable[dict], config: PromptSourceConfig, origin: str) -> list[Prompt]:
    records = list(records)
    prompts = []
    skipped = empty = unencodable = 0
    for record in records:
        text = field_value(record, config.prompt_field)
        if not isinstance(text, str) or not text.strip():
            skipped += 1
            empty += isinstance(text, str)
            continue
        if not _is_utf8(text):  # a JSON escape like "\ud800" decodes to a lone surrogate no tokenizer takes
            skipped += 1
            unencodable += 1
            continue
        domain = config.domain
        if config.domain_field:
            domain = field_value(record, config.domain_field)
            if not isinstance(domain, str) or not re.fullmatch(DOMAIN_PATTERN, domain):
                raise DraftlineError(
                    f"{origin}: field '{config.domain_field}' has value {domain!r}, expected a domain name "
                    "(letters, digits, '_' or '-'); set a fixed 'domain' instead of 'domain_field'"
                )
        prompts.append(Prompt(text, domain, origin, config.chat))
    if records and not prompts:
        keys = sorted(records[0].keys()) if isinstance(records[0], dict) else []
        if empty:
            raise DraftlineError(f"{origin}: every '{config.prompt_field}' is empty or whitespace ({empty} of "
                                 f"{len(records)} records); fill them in or point prompt_field at another field")
        if unencodable:
            raise DraftlineError(f"{origin}: every '{config.prompt_field}' holds invalid Unicode (lone surrogates, "
                                 f"{unencodable} of {len(records)} records); fix the file's text")
        found = field_value(records[0], config.prompt_field)
        if found is not None:  # the field is there but holds an object, list or number
            raise DraftlineError(f"{origin}: '{config.prompt_field}' is not text in any record (the first holds a "
                                 f"{type(found).__name__}); point prompt_field at the text inside it with a dotted path "
                                 f"('{config.prompt_field}.<key>' or '{config.prompt_field}.0')")
        raise DraftlineError(
            f"{origin}: no record has a text field '{config.prompt_field}' (fields: {keys}); fix prompt_field"
        )
    if skipped:
        invalid = f" ({unencodable} of them invalid Unicode)" if unencodable else ""
        info(f"{origin}: skipped {skipped} of {len(records)} records without a text '{config.prompt_field}'{invalid}")
    return prompts


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def hf_records(config: PromptSourceConfig) -> list[dict]:
    import datasets

    try:
        dataset = datasets.load_dataset(config.name, config.subset, split=config.split, download_mode="reuse_cache_if_exists")
    except Exception as error:  # datasets raises many types when a dataset is not cached
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DraftlineError(
            f"HF dataset '{config.name}' (split '{config.split}') is not in the local cache ({reason}); "
            "download it once with network access, or use a 'file' source"
        ) from None
    return list(dataset)


# --------------------------------------------------------------------------- selection


def load_source(config: PromptSourceConfig) -> list[Prompt]:
    if config.kind == "stdlib_code":
        prompts = [Prompt(text, config.fixed_domain, "stdlib_code") for text in stdlib_code_prompts()]
    elif config.kind == "stdlib_text":
        prompts = [Prompt(text, config.fixed_domain, "stdlib_text") for text in stdlib_text_prompts()]
    elif config.kind == "file":
        try:
            path = Path(config.path).expanduser()
        except RuntimeError:  # `~someone/` for a user this machine does not know
            raise DraftlineError(f"prompt file {config.path}: cannot expand '~' (no such user or home directory); "
                                 "fix corpus.sources[].path") from None
        prompts = map_records(read_records(path), config, path.name)
    else:
        prompts = map_records(hf_records(config), config, f"hf:{config.name}")
    return stable_order(prompts, salt=config.kind)[: config.limit] if config.limit else prompts


def stable_hash(text: str, salt: str = "") -> int:
    return int.from_bytes(hashlib.sha256(f"{salt}\0{text}".encode()).digest()[:8], "big")


def stable_order(prompts: list[Prompt], salt: str) -> list[Prompt]:
    """A fixed pseudo-random order: limits take a spread sample, not the first modules alphabetically."""
    return sorted(prompts, key=lambda p: stable_hash(p.prompt, salt))


def deduplicate(prompts: Iterable[Prompt]) -> list[Prompt]:
    """First occurrence of each prompt text (whitespace-trimmed) wins."""
    seen: set[str] = set()
    unique = []
    for prompt in prompts:
        key = prompt.prompt.strip()
        if key not in seen:
            seen.add(key)
            unique.append(prompt)
    return unique


def split_of(prompt_text: str, split: SplitConfig) -> str:
    """By a hash of the prompt text alone, so the same prompt always lands in the same split."""
    fraction = stable_hash(prompt_text.strip(), "split") / 2**64
    if fraction < split.test:
        return "test"
    if fraction < split.test + split.validation:
        return "validation"
    return "train"


def collect_prompts(config: CorpusConfig) -> list[Prompt]:
    """All sources, deduplicated, at most `max_prompts_per_domain` per domain, in a fixed order."""
    prompts = deduplicate(prompt for source in config.sources for prompt in load_source(source))
    chosen = []
    for domain in sorted({prompt.domain for prompt in prompts}):
        in_domain = stable_order([p for p in prompts if p.domain == domain], salt=f"select{config.seed}")
        limit = config.prompt_limit(domain)
        chosen.extend(in_domain[:limit] if limit else in_domain)
    if not chosen:
        raise DraftlineError("corpus.sources produced no prompts; check the sources and their prompt_field")
    check_splits(chosen, config)
    return chosen


def check_splits(prompts: list[Prompt], config: CorpusConfig) -> None:
    """Training needs train + validation and evaluation needs test: an empty split found only after
    generation would waste the whole build, so it is refused before any generation."""
    counts = {name: 0 for name in ("train", "validation", "test")}
    for prompt in prompts:
        counts[split_of(prompt.prompt, config.split)] += 1
    empty = [name for name, count in counts.items() if count == 0]
    if empty:
        raise DraftlineError(
            f"corpus: {len(prompts)} prompts leave split(s) {empty} empty (split by prompt: {counts}); raise "
            "corpus.max_prompts_per_domain, add sources, or raise corpus.split.validation / corpus.split.test"
        )
