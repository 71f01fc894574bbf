"""`draftline features estimate`: the disk a verifier's features need per dtype, from its config.json and a token
count or a corpus stats.json; a missing or invalid input is one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.drafters.registry import KIND_SPECS

# a 4-layer x 64 verifier: ar stores layer 4; block 3 and 4; eagle3 (aux 1, 2, 3) and all kinds 1..4
CONFIG = {"model_type": "qwen3", "num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 100}


@pytest.fixture
def project(tmp_path) -> Path:
    params = {"features": {"max_seq_len": 50},
              "train": {kind: {"trainer": {"max_seq_len": 50}} for kind in KIND_SPECS}}
    (tmp_path / "params.yaml").write_text(json.dumps(params))  # YAML reads JSON
    (tmp_path / "verifier").mkdir()
    (tmp_path / "verifier" / "config.json").write_text(json.dumps(CONFIG))
    return tmp_path


def estimate(project: Path, *args: str) -> int:
    return main(["features", "estimate", "--params", str(project / "params.yaml"), *args])


def table(out: str) -> dict[str, list[str]]:
    """{kinds: [layers, float32, bfloat16, float16, float8_e4m3]} from the printed table (columns: 2+ spaces)."""
    lines = out.splitlines()
    header = next(index for index, line in enumerate(lines) if line.startswith("kinds"))
    return {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[header + 1:])}


def test_bytes_per_token_and_total_per_dtype(project, capsys):
    assert estimate(project, str(project / "verifier"), "--tokens", "1000") == 0
    out = capsys.readouterr().out
    assert "4 layers x 64; corpus 1,000 tokens (--tokens)" in out
    rows = table(out)
    # a token: its 8-byte id and 64 states a layer; e4m3 adds a 4-byte scale a layer
    assert rows["ar"] == ["4", "264 B = 257.8 KiB", "136 B = 132.8 KiB", "136 B = 132.8 KiB", "76 B = 74.2 KiB"]
    assert rows["block"][:2] == ["3,4", "520 B = 507.8 KiB"]
    assert rows["dspark"] == rows["block"]  # the same DFlash pass reads the same layers
    assert rows["ar+block+dspark+eagle3 (params)"] == ["1,2,3,4", "1,032 B = 1007.8 KiB", "520 B = 507.8 KiB",
                                                        "520 B = 507.8 KiB", "280 B = 273.4 KiB"]


def test_tokens_from_a_corpus_stats_json_are_cut_at_max_seq_len(project, capsys):
    stats = project / "stats.json"
    stats.write_text(json.dumps({"rows": 10, "prompt_tokens": 300, "response_tokens": 400}))
    assert estimate(project, str(project / "verifier" / "config.json"), "--corpus-stats", str(stats)) == 0
    out = capsys.readouterr().out
    assert "corpus 500 tokens" in out and "at most features.max_seq_len 50 a row" in out  # 10 rows x 50, not 700
    assert table(out)["ar"][1] == "264 B = 128.9 KiB"


def test_a_multimodal_config_reads_its_text_config(project, capsys):
    (project / "verifier" / "config.json").write_text(json.dumps({"model_type": "x", "text_config": CONFIG}))
    assert estimate(project, str(project / "verifier"), "--tokens", "1000") == 0
    assert table(capsys.readouterr().out)["ar"][1] == "264 B = 257.8 KiB"


@pytest.mark.parametrize(("config", "message"), [
    (None, "config.json: not found; pass the verifier's model directory (or its config.json)"),
    ("{not json", "config.json: not a readable HF model config (JSONDecodeError)"),
    ("[1, 2]", "config.json: not a HF model config (a JSON object)"),
    (json.dumps({"hidden_size": 64}), "no positive integer num_hidden_layers and hidden_size"),
    (json.dumps({**CONFIG, "hidden_size": "64"}), "no positive integer num_hidden_layers and hidden_size"),
])
def test_a_missing_or_invalid_config_is_one_line(project, capsys, config, message):
    path = project / "verifier" / "config.json"
    path.unlink()
    if config is not None:
        path.write_text(config)
    assert estimate(project, str(project / "verifier"), "--tokens", "10") == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("draftline: error: ") and message in captured.err


def test_invalid_corpus_stats_is_one_line(project, capsys):
    stats = project / "stats.json"
    stats.write_text(json.dumps({"rows": 10}))
    assert estimate(project, str(project / "verifier"), "--corpus-stats", str(stats)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no positive integer rows, prompt_tokens and response_tokens" in err
