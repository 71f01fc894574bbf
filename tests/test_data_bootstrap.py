"""bootstrap_verifier: a tiny real training run gives a loadable HF dir; the `hf` source records only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_prep import bootstrap_verifier
from data_prep.stdlib_text import collect_stdlib_texts
from data_prep.tokenizer import EOS_TOKEN, MASK_TOKEN, PAD_TOKEN
from data_prep.verifier import check_same_tokenizer, load_verifier, mask_token_id, verifier_identity
from pipeline.config import load_params
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from tests.tiny_models import tiny_tokenizer

TINY_BOOTSTRAP = {"vocab_size": 400, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                  "intermediate_size": 64, "head_dim": 16, "seq_len": 32, "batch_size": 4, "max_steps": 6,
                  "warmup_steps": 2, "eval_every": 3, "max_corpus_chars": 60_000, "time_budget_s": 60}


def write_params(root: Path, verifier: dict) -> Path:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump({"project": {"artifacts_dir": str(root / "artifacts")}, "verifier": verifier}))
    return path


def test_stdlib_text_is_deterministic_and_capped():
    first, second = collect_stdlib_texts(50_000), collect_stdlib_texts(50_000)
    assert first == second
    assert 40_000 < first.chars <= 50_000 and first.code and first.prose
    assert any("def " in chunk for chunk in first.code)


def test_tiny_bootstrap_trains_and_saves_a_standard_checkpoint(tmp_path, capsys):
    params = write_params(tmp_path, {"source": "bootstrap", "bootstrap": TINY_BOOTSTRAP})
    assert bootstrap_verifier.main(["--params", str(params)]) == 0
    output = capsys.readouterr()
    assert "val loss code" in output.err and "val loss text" in output.err
    directory = tmp_path / "artifacts" / "verifier"
    assert {"config.json", "model.safetensors", "tokenizer.json", "verifier.json"} <= {p.name for p in directory.iterdir()}
    # nothing downstream needs to know it was bootstrapped: plain Auto* classes load it
    model = AutoModelForCausalLM.from_pretrained(directory, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.num_hidden_layers == 2
    assert tokenizer.eos_token == EOS_TOKEN and tokenizer.pad_token == PAD_TOKEN and tokenizer.padding_side == "left"
    assert mask_token_id(tokenizer) == tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    history = json.loads((directory / "bootstrap.json").read_text())["history"]
    assert history[-1]["step"] == 6 and history[-1]["val_loss_code"] < history[0]["val_loss_code"] + 1.0
    paths = ArtifactPaths.from_params(load_params(params))
    identity = verifier_identity(paths)
    assert identity["source"] == "bootstrap" and identity["id"].endswith(identity["hash"][:12])
    loaded, loaded_tokenizer = load_verifier(paths)
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    ids = torch.tensor([loaded_tokenizer("def f(x):")["input_ids"]])
    assert torch.allclose(loaded(ids).logits, model(ids).logits)
    check_same_tokenizer(loaded_tokenizer, tokenizer, "test")
    with pytest.raises(DraftlineError, match="vocabulary differs"):
        check_same_tokenizer(loaded_tokenizer, tiny_tokenizer(), "drafter")


def test_hf_source_records_path_and_hash_without_copying(tmp_path, tiny_verifier_dir, capsys):
    params = write_params(tmp_path, {"source": "hf", "name_or_path": str(tiny_verifier_dir)})
    assert bootstrap_verifier.main(["--params", str(params)]) == 0
    directory = tmp_path / "artifacts" / "verifier"
    assert [p.name for p in directory.iterdir()] == ["verifier.json"]
    record = json.loads((directory / "verifier.json").read_text())
    assert record["source"] == "hf" and Path(record["name_or_path"]) == Path(tiny_verifier_dir).resolve()
    model, _ = load_verifier(ArtifactPaths.from_params(load_params(params)))
    assert model.config.num_hidden_layers == 4

    (tmp_path / "m").mkdir()
    missing = write_params(tmp_path / "m", {"source": "hf", "name_or_path": str(tmp_path / "no-such-model")})
    capsys.readouterr()
    assert bootstrap_verifier.main(["--params", str(missing)]) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "neither a local directory nor a model in the local HF cache" in error
    assert not (tmp_path / "m" / "artifacts").exists()
