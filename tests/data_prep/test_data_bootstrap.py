"""bootstrap_verifier: a tiny real training run gives a loadable HF dir, the same one every time; the `hf`
source records only."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_prep import bench_verifier, bootstrap_verifier
from data_prep.stdlib_text import collect_stdlib_texts
from data_prep.tokenizer import EOS_TOKEN, MASK_TOKEN, PAD_TOKEN
from data_prep.verifier import load_verifier
from pipeline.config.schema import load_all
from pipeline.errors import DraftlineError
from pipeline.integrity import check_same_tokenizer, mask_token_id
from pipeline.lineage import hash_file
from pipeline.paths import ArtifactPaths
from pipeline.verifier_record import verifier_identity
from tests.support.tiny_models import tiny_tokenizer

TINY_BOOTSTRAP = {"vocab_size": 400, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                  "intermediate_size": 64, "head_dim": 16, "seq_len": 32, "batch_size": 4, "max_steps": 6,
                  "warmup_steps": 2, "eval_every": 3, "max_corpus_chars": 60_000}


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
    report = json.loads((directory / "bootstrap.json").read_text())
    history = report["history"]
    assert report["steps"] == 6 and [entry["step"] for entry in history] == [3, 6]
    assert history[-1]["val_loss_code"] < history[0]["val_loss_code"] + 1.0
    for domain in ("code", "text"):  # the loop check ran on real prompts and its targets are recorded
        assert report["loop_check"][domain]["prompts"] == bootstrap_verifier.PROBE_PROMPTS_PER_DOMAIN
        assert 0.0 <= report["loop_check"][domain]["distinct_4gram"] <= 1.0
        assert set(report["targets"][f"distinct_4gram_{domain}"]) == {"value", "target", "met"}
    assert "distinct 4gram text" in output.err
    paths = ArtifactPaths.from_params(load_all(params))
    identity = verifier_identity(paths)
    assert identity["source"] == "bootstrap" and identity["id"].endswith(identity["hash"][:12])
    versions = json.loads((directory / "verifier.json").read_text())["library_versions"]
    assert versions["torch"] == torch.__version__ and versions["transformers"]
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
    model, _ = load_verifier(ArtifactPaths.from_params(load_all(params)))
    assert model.config.num_hidden_layers == 4

    (tmp_path / "m").mkdir()
    missing = write_params(tmp_path / "m", {"source": "hf", "name_or_path": str(tmp_path / "no-such-model")})
    capsys.readouterr()
    assert bootstrap_verifier.main(["--params", str(missing)]) == 1
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "neither a local directory nor a model in the local HF cache" in error
    assert not (tmp_path / "m" / "artifacts").exists()


def _weights_digest(directory: Path) -> str:
    return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()


METADATA_FILES = ("bootstrap.json", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def test_same_params_give_bitwise_identical_weights_and_directory(tmp_path):
    digests, records, files = [], [], []
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
        params = write_params(tmp_path / run, {"bootstrap": {**TINY_BOOTSTRAP, "max_steps": 4, "eval_every": 4}})
        assert bootstrap_verifier.main(["--params", str(params)]) == 0
        directory = tmp_path / run / "artifacts" / "verifier"
        digests.append(_weights_digest(directory))
        records.append(json.loads((directory / "verifier.json").read_text()))
        files.append({name: hash_file(directory / name) for name in METADATA_FILES})
    assert digests[0] == digests[1]
    # the model identity, and every file the stage writes besides verifier.json (whose name_or_path is
    # this run's directory), byte for byte: bootstrap.json has no wall times in it
    assert records[0]["id"] == records[1]["id"] and files[0] == files[1]
    # and the seed matters: a different one gives different weights
    (tmp_path / "seed").mkdir()
    params = write_params(tmp_path / "seed", {"bootstrap": {**TINY_BOOTSTRAP, "max_steps": 4, "eval_every": 4}})
    config = yaml.safe_load(params.read_text())
    config["project"]["seed"] = 1
    params.write_text(yaml.safe_dump(config))
    assert bootstrap_verifier.main(["--params", str(params)]) == 0
    assert _weights_digest(tmp_path / "seed" / "artifacts" / "verifier") != digests[0]


def test_time_guard_fails_with_one_line_and_no_artifact(tmp_path, capsys):
    params = write_params(tmp_path, {"bootstrap": {**TINY_BOOTSTRAP, "max_time_s": 1e-9}})
    assert bootstrap_verifier.main(["--params", str(params)]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("draftline: error: bootstrap verifier:") and "max_time_s" in error
    assert not (tmp_path / "artifacts" / "verifier").exists()


def test_training_batches_cover_each_window_once_per_epoch():
    stream = torch.arange(100)
    batches = bootstrap_verifier.training_batches(stream, batch=3, length=10, generator=torch.Generator().manual_seed(0))
    first_epoch = torch.cat([next(batches) for _ in range(3)])  # 9 or 10 windows per epoch: 3 batches fit
    starts = first_epoch[:, 0].tolist()
    assert len(set(starts)) == 9 and all((first_epoch[:, 1:] - first_epoch[:, :-1] == 1).all(dim=1))
    assert len({start % 10 for start in starts}) == 1  # one offset per epoch, non-overlapping windows


def test_schedule_warms_up_then_ends_at_a_tenth_exactly_at_max_steps():
    config = bootstrap_verifier.BootstrapConfig(max_steps=100, warmup_steps=10, learning_rate=1e-3)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate)
    schedule = bootstrap_verifier.make_schedule(optimizer, config)
    rates = []
    for _ in range(101):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[1] == pytest.approx(1e-4) and rates[10] == pytest.approx(1e-3)
    assert rates[:100] == sorted(rates[:11]) + sorted(rates[11:100], reverse=True)
    assert rates[100] == pytest.approx(1e-4)


def test_distinct_4gram_ratio_flags_loops():
    assert bootstrap_verifier.distinct_4gram_ratio([[1, 2, 3, 4, 5, 6]]) == 1.0
    assert bootstrap_verifier.distinct_4gram_ratio([[7] * 20]) == pytest.approx(1 / 17)
    assert bootstrap_verifier.distinct_4gram_ratio([[1, 2, 3]]) == 0.0


def test_bench_flops_count_matches_a_hand_count():
    config = bootstrap_verifier.BootstrapConfig(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=2,
                                                num_kv_heads=1, head_dim=32, intermediate_size=128, seq_len=16)
    attention = 64 * 32 * 2 + 2 * 64 * 32 * 1 + 32 * 2 * 64  # q, k+v, o
    matmul_params = 2 * (attention + 3 * 64 * 128) + 64 * 1000
    assert bench_verifier.training_flops_per_token(config) == 6 * matmul_params + 6 * 2 * 16 * 2 * 32


def _external(tmp_path: Path, name_or_path: str, capsys) -> str:
    """bootstrap_verifier on an external verifier that must be refused: its one error line."""
    params = write_params(tmp_path, {"source": "hf", "name_or_path": name_or_path})
    capsys.readouterr()
    assert bootstrap_verifier.main(["--params", str(params)]) == 1
    assert not (tmp_path / "artifacts" / "verifier").exists()
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "Traceback" not in error
    return error


def test_a_directory_that_is_not_a_model_is_refused_without_walking_it(tmp_path, capsys):
    """`verifier.name_or_path: /` once walked the filesystem into PermissionError: '/proc/1/cwd'."""
    assert "not a model checkpoint (no config.json" in _external(tmp_path, "/", capsys)


def test_a_verifier_without_tokenizer_files_is_refused(tmp_path, tiny_verifier_dir, capsys):
    """Once accepted, after which build_corpus wrote an empty corpus (0 prompts in 0 shards)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (model_dir / name).write_bytes((tiny_verifier_dir / name).read_bytes())
    assert "encodes text to no ids" in _external(tmp_path, str(model_dir), capsys)


def test_a_tokenizer_with_more_ids_than_embedding_rows_is_refused(tmp_path, capsys):
    from tests.support.tiny_models import tiny_qwen3

    model_dir = tmp_path / "model"
    tokenizer = tiny_tokenizer()
    tiny_qwen3(len(tokenizer) - 8, num_layers=2).save_pretrained(model_dir)  # 8 ids have no embedding row
    tokenizer.save_pretrained(model_dir)
    error = _external(tmp_path, str(model_dir), capsys)
    assert f"has {len(tokenizer)} ids but the model has {len(tokenizer) - 8} embedding rows" in error
