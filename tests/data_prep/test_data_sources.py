"""Prompt sources: real HumanEval/MT-Bench files, the generic field mapping, dedup, limits, split."""

from __future__ import annotations

import ast
import gzip
import itertools
import json
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_prep.sources import (
    Prompt,
    collect_prompts,
    deduplicate,
    field_value,
    load_source,
    split_of,
    stdlib_code_prompts,
    stdlib_text_prompts,
)
from pipeline.config.corpus_config import CorpusConfig, PromptSourceConfig, SplitConfig
from pipeline.errors import DraftlineError

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} not present")


@needs_shared
def test_humaneval_loads_through_the_field_mapping():
    prompts = load_source(PromptSourceConfig(kind="file", path=str(SHARED_DATA / "HumanEval.jsonl.gz"), domain="code"))
    assert len(prompts) == 164
    assert all(p.domain == "code" and p.source == "HumanEval.jsonl.gz" for p in prompts)
    assert all("def " in p.prompt for p in prompts)


@needs_shared
def test_mt_bench_first_turn_loads_through_an_indexed_path():
    path = SHARED_DATA / "mt_bench_question.jsonl"
    prompts = load_source(PromptSourceConfig(kind="file", path=str(path), prompt_field="turns.0", domain="text"))
    first_record = json.loads(path.read_text().splitlines()[0])
    assert len(prompts) == 80
    assert prompts[0].prompt == first_record["turns"][0]
    assert all(p.domain == "text" for p in prompts)


def test_field_value_follows_nested_and_indexed_paths():
    record = {"a": {"turns": ["first", "second"]}, "x": 1}
    assert field_value(record, "a.turns.0") == "first"
    assert field_value(record, "a.turns.-1") == "second"
    assert field_value(record, "a.turns.2") is None
    assert field_value(record, "missing") is None


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".jsonl.gz", ".parquet"])
def test_every_file_format_maps_prompt_and_domain(tmp_path, suffix):
    records = [{"text": f"prompt {i}", "kind": "code" if i % 2 else "text"} for i in range(6)]
    path = tmp_path / f"prompts{suffix}"
    if suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    elif suffix == ".json":
        path.write_text(json.dumps({"data": records}))
    else:
        lines = "".join(json.dumps(r) + "\n" for r in records)
        path.write_bytes(gzip.compress(lines.encode()) if suffix.endswith(".gz") else lines.encode())
    prompts = load_source(PromptSourceConfig(kind="file", path=str(path), prompt_field="text", domain_field="kind"))
    assert [(p.prompt, p.domain) for p in prompts] == [(r["text"], r["kind"]) for r in records]


def test_wrong_prompt_field_and_domain_values_are_clear_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"question": "hi", "kind": "math.algebra"}) + "\n")  # metrics are <domain>.<name>
    with pytest.raises(DraftlineError, match="no record has a text field 'prompt'.*question"):
        load_source(PromptSourceConfig(kind="file", path=str(path), domain="text"))
    with pytest.raises(DraftlineError, match="'math.algebra', expected a domain name"):
        load_source(PromptSourceConfig(kind="file", path=str(path), prompt_field="question", domain_field="kind"))
    with pytest.raises(DraftlineError, match="not found"):
        load_source(PromptSourceConfig(kind="file", path=str(tmp_path / "nope.jsonl"), domain="text"))


def test_a_directory_fifo_or_device_as_prompt_file_says_what_it_is(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.jsonl")
    (tmp_path / "dir.jsonl").mkdir()
    for path, expected in ((tmp_path / "dir.jsonl", "is a directory"), (tmp_path / "fifo.jsonl", "FIFO"),
                           (Path("/dev/zero"), "device")):
        with pytest.raises(DraftlineError, match=expected) as error:  # a FIFO must not block the stage
            load_source(PromptSourceConfig(kind="file", path=str(path), domain="text"))
        assert "not found" not in str(error.value)


def test_an_empty_text_field_is_not_reported_as_a_missing_field(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in ("", "  ")))
    with pytest.raises(DraftlineError, match="every 'prompt' is empty or whitespace .2 of 2") as error:
        load_source(PromptSourceConfig(kind="file", path=str(path), domain="text"))
    assert "no record has" not in str(error.value)


def test_uncached_hf_dataset_is_a_clear_error():
    with pytest.raises(DraftlineError, match="not in the local cache"):
        load_source(PromptSourceConfig(kind="hf", name="draftline-test/definitely-not-cached", domain="text"))


def test_builtin_sources_yield_signatures_with_docstrings_and_prose():
    code = list(itertools.islice(stdlib_code_prompts(), 200))
    text = list(itertools.islice(stdlib_text_prompts(), 50))
    signatures = [p for p in code if p.lstrip().startswith(("def ", "async def "))]
    assert signatures
    for prompt in signatures:  # a signature plus its docstring is itself a complete function
        function = ast.parse(textwrap.dedent(prompt)).body[0]
        assert isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(function)
    assert all(len(p) >= 80 and "\n" not in p for p in text)


def test_dedup_limits_and_split_never_leak_a_prompt(tmp_path):
    records = [{"p": f"prompt number {i % 150}", "d": "code" if i % 3 else "text"} for i in range(300)]
    path = tmp_path / "dups.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    source = PromptSourceConfig(kind="file", path=str(path), prompt_field="p", domain_field="d")
    config = CorpusConfig(sources=[source, source], max_prompts_per_domain={"code": 60, "text": 40})
    prompts = collect_prompts(config)
    texts = [p.prompt for p in prompts]
    assert len(texts) == len(set(texts)) == 100
    assert sum(p.domain == "code" for p in prompts) == 60
    split = SplitConfig(validation=0.2, test=0.2)
    by_split = {name: {p.prompt for p in prompts if split_of(p.prompt, split) == name}
                for name in ("train", "validation", "test")}
    assert not (by_split["train"] & by_split["validation"]) and not (by_split["train"] & by_split["test"])
    assert all(len(group) >= 5 for group in by_split.values())
    # whitespace variants are the same prompt, so they dedup and always share a split
    assert len(deduplicate([Prompt("a b", "text", "x"), Prompt(" a b\n", "text", "y")])) == 1
    assert split_of("a b", split) == split_of(" a b\n", split)
    # the selection is stable: the same config picks the same prompts in the same order
    assert [p.prompt for p in collect_prompts(config)] == texts


def test_malformed_jsonl_names_the_file_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n{"prompt": "c",,}\n')
    with pytest.raises(DraftlineError, match="line 4 is not valid JSON"):
        load_source(PromptSourceConfig(kind="file", path=str(path), domain="text"))


def test_records_without_the_prompt_field_are_counted(tmp_path, capsys):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"prompt": "a"}, {"other": 1}, {"prompt": ""}]))
    prompts = load_source(PromptSourceConfig(kind="file", path=str(path), domain="text"))
    assert [p.prompt for p in prompts] == ["a"]
    assert "skipped 2 of 3 records without a text 'prompt'" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("name, content, expected", [
    ("deep.json", "[" * 100000 + "]" * 100000, "deep.json .JSON nested too deeply"),
    ("deep.jsonl", '{"prompt": "a"}\n' + "[" * 100000 + "]" * 100000 + "\n", "line 2 is JSON nested too deeply"),
])
def test_json_nested_too_deeply_is_a_clear_error(tmp_path, name, content, expected):
    """The json module recurses once per level: a hostile file would otherwise end in a RecursionError."""
    (tmp_path / name).write_text(content)
    with pytest.raises(DraftlineError, match=expected):
        load_source(PromptSourceConfig(kind="file", path=str(tmp_path / name), domain="text"))


def test_prompts_that_are_not_valid_unicode_are_skipped_and_counted(tmp_path, capsys):
    """A JSON escape like \\ud800 decodes to a lone surrogate, which no tokenizer (or hash) can encode."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": "bad \\ud800 text"}\n')
    prompts = load_source(PromptSourceConfig(kind="file", path=str(path), domain="text"))
    assert [p.prompt for p in prompts] == ["fine"]
    assert [p.prompt for p in deduplicate(prompts)] == ["fine"]  # selection hashes every prompt it keeps
    assert "skipped 1 of 2 records without a text 'prompt' (1 of them invalid Unicode)" in " ".join(
        capsys.readouterr().err.split())
    path.write_text('{"prompt": "bad \\ud800 text"}\n')
    with pytest.raises(DraftlineError, match="invalid Unicode .lone surrogates, 1 of 1"):
        load_source(PromptSourceConfig(kind="file", path=str(path), domain="text"))


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".jsonl.gz"])
def test_a_utf8_byte_order_mark_is_read_past(tmp_path, suffix):
    """Files saved on Windows often start with a BOM, which json.loads rejects."""
    text = '{"prompt": "a"}\n{"prompt": "b"}\n' if suffix != ".json" else '[{"prompt": "a"}, {"prompt": "b"}]'
    data = b"\xef\xbb\xbf" + text.encode()
    path = tmp_path / f"p{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    prompts = load_source(PromptSourceConfig(kind="file", path=str(path), domain="text"))
    assert [p.prompt for p in prompts] == ["a", "b"]


def test_a_prompt_field_holding_an_object_says_so(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": {"text": "a"}}) + "\n")
    with pytest.raises(DraftlineError, match=r"'prompt' is not text in any record \(the first holds a dict\)"):
        load_source(PromptSourceConfig(kind="file", path=str(path), domain="text"))
    prompts = load_source(PromptSourceConfig(kind="file", path=str(path), prompt_field="prompt.text", domain="text"))
    assert [p.prompt for p in prompts] == ["a"]
