"""build_corpus: the contract DatasetDict, kill-and-resume equality, clear errors, loaders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from data_prep import build_corpus
from data_prep.build_corpus import WorkItem, fingerprint, load_shard
from data_prep.corpus import COLUMNS, corpus_hash, load_corpus
from pipeline.config.corpus_config import CorpusConfig
from pipeline.config.schema import load_all
from pipeline.errors import DraftlineError
from pipeline.lineage import hash_dir
from pipeline.paths import ArtifactPaths
from pipeline.verifier_record import write_record
from tests.support.tiny_models import save_tiny_verifier

REPO = Path(__file__).resolve().parents[2]


def make_project(root: Path, *, prompts: int = 24, shard_size: int = 2, with_verifier: bool = True) -> Path:
    """A params file with a file prompt source and (optionally) a tiny verifier under root/artifacts."""
    records = [{"q": {"turns": [f"def function_{i}(x):\n    return x * {i} +", "second turn"]},
                "kind": "code" if i % 2 else "text"} for i in range(prompts)]
    records.append(dict(records[0]))  # a duplicate prompt must be dropped
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if with_verifier:
        verifier_dir = root / "artifacts" / "verifier"
        save_tiny_verifier(verifier_dir, num_layers=2)
        write_record(verifier_dir, source="bootstrap", name_or_path=str(verifier_dir), id_prefix="tiny")
    params = {
        "project": {"artifacts_dir": str(root / "artifacts")},
        "corpus": {
            "sources": [{"kind": "file", "path": str(root / "prompts.jsonl"), "prompt_field": "q.turns.0",
                         "domain_field": "kind"}],
            "max_prompts_per_domain": {"code": prompts, "text": prompts},
            "max_new_tokens": 8, "batch_size": 2, "shard_size": shard_size,
            "split": {"validation": 0.2, "test": 0.2},
        },
    }
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def stage(params: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "data_prep.build_corpus", "--params", str(params)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def rows(corpus) -> dict[str, list[dict]]:
    return {split: corpus[split].to_list() for split in corpus}


def assert_one_line_error(process: subprocess.Popen, expected: str) -> None:
    _, stderr = process.communicate(timeout=120)
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert process.returncode != 0
    assert "Traceback" not in stderr
    assert len(lines) == 1 and expected in lines[0], stderr


@pytest.mark.slow
def test_kill_and_resume_gives_the_uninterrupted_corpus(tmp_path, capsys):
    reference_root, killed_root = tmp_path / "reference", tmp_path / "killed"
    reference_root.mkdir(), killed_root.mkdir()
    reference_params, killed_params = make_project(reference_root), make_project(killed_root)

    killed = stage(killed_params)  # a real process, killed with SIGKILL once its first shard is committed
    shard_root = killed_root / "artifacts" / "corpus_shards"
    deadline = time.monotonic() + 120
    while not list(shard_root.glob("*/shard-*.json")) and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    done_before_restart = len(list(shard_root.glob("*/shard-*.json")))
    total_shards = 12  # 24 prompts / 2
    assert killed.returncode == -signal.SIGKILL and 1 <= done_before_restart < total_shards
    assert not (killed_root / "artifacts" / "corpus").exists()  # nothing partial

    assert build_corpus.main(["--params", str(reference_params)]) == 0
    capsys.readouterr()
    assert build_corpus.main(["--params", str(killed_params)]) == 0
    assert f"{done_before_restart} / {total_shards}" in capsys.readouterr().err  # finished shards were reused

    paths = [ArtifactPaths.from_params(load_all(p)) for p in (reference_params, killed_params)]
    expected, actual = (load_corpus(p) for p in paths)
    assert rows(actual) == rows(expected)
    # byte-identical datasets, not only equal rows (stats.json differs only in the params fingerprint:
    # the two projects read their prompts from different paths)
    assert hash_dir(paths[0].corpus, exclude=("stats.json",)) == hash_dir(paths[1].corpus, exclude=("stats.json",))

    # the contract: columns, both domains, no prompt in two splits, stats per domain and split
    assert all(expected[split].column_names == list(COLUMNS) for split in expected)
    all_rows = [row for split_rows in rows(expected).values() for row in split_rows]
    assert len(all_rows) == 24 and {row["domain"] for row in all_rows} == {"code", "text"}
    prompts_by_split = {split: {row["prompt"] for row in split_rows} for split, split_rows in rows(expected).items()}
    assert not (prompts_by_split["train"] & prompts_by_split["test"])
    assert not (prompts_by_split["train"] & prompts_by_split["validation"])
    assert all(0 < len(row["response_ids"]) <= 8 and row["finish_reason"] in ("eos", "length") for row in all_rows)
    stats = json.loads((paths[0].corpus / "stats.json").read_text())
    assert stats["rows"] == 24 and stats["response_tokens"] == sum(len(r["response_ids"]) for r in all_rows)
    assert sum(stats["by_split"][s]["code"]["rows"] for s in ("train", "validation", "test")) == 12

    # a corrupt shard is regenerated alone and the corpus comes out the same
    shard = sorted(shard_root.glob("*/shard-*.json"))[0]
    shard.write_text("{not json")
    before = corpus_hash(paths[1])
    capsys.readouterr()
    assert build_corpus.main(["--params", str(killed_params)]) == 0
    assert "regenerating only that shard" in " ".join(capsys.readouterr().err.split())
    assert corpus_hash(paths[1]) == before


def test_missing_verifier_is_one_line_and_writes_nothing(tmp_path):
    params = make_project(tmp_path, with_verifier=False)
    assert_one_line_error(stage(params), "run `dvc repro bootstrap_verifier`")
    assert not (tmp_path / "artifacts" / "corpus").exists()
    assert not (tmp_path / "artifacts" / "corpus_shards").exists()


def test_corrupt_or_missing_corpus_is_a_clear_error(tmp_path):
    paths = ArtifactPaths(root=tmp_path, metrics=tmp_path, plots=tmp_path)
    with pytest.raises(DraftlineError, match="no corpus.*run `dvc repro build_corpus`"):
        load_corpus(paths)
    paths.corpus.mkdir()
    (paths.corpus / "dataset_dict.json").write_text("{broken")
    with pytest.raises(DraftlineError, match="corrupt") as error:
        load_corpus(paths)
    assert "\n" not in str(error.value)


def test_a_shard_from_other_inputs_damaged_or_poisoned_is_not_reused(tmp_path):
    shard = tmp_path / "shard-00000.json"
    x, y = (WorkItem(name, "code", "test", "train", "p", (5, 6), 0) for name in ("x", "y"))
    row = {"id": "x", "prompt_ids": [5, 6], "response_ids": [7, 8], "finish_reason": "length"}

    def write(**changes):
        shard.write_text(json.dumps({"fingerprint": "aaa", "index": 0, "rows": [{**row, **changes}]}))

    write()
    assert load_shard(shard, "aaa", [x], 100, 4)["rows"] == [row]
    assert load_shard(shard, "bbb", [x], 100, 4) is None
    assert load_shard(shard, "aaa", [y], 100, 4) is None
    for poison in ({"response_ids": [7, 100]}, {"response_ids": [-1]}, {"response_ids": [7, 2**70]},
                   {"response_ids": ["7"]}, {"response_ids": [True]}, {"prompt_ids": [9, 9]},
                   {"response_ids": [1] * 6}, {"finish_reason": "abort"}):
        write(**poison)
        assert load_shard(shard, "aaa", [x], 100, 4) is None, poison
    write()
    shard.write_text(shard.read_text()[:20])
    assert load_shard(shard, "aaa", [x], 100, 4) is None


def test_a_truncated_shard_is_regenerated_alone(tmp_path):
    params = make_project(tmp_path, prompts=10, shard_size=4)
    assert build_corpus.main(["--params", str(params)]) == 0
    shard_dir = next((tmp_path / "artifacts" / "corpus_shards").iterdir())
    shards = sorted(shard_dir.iterdir())
    assert len(shards) >= 3
    before = {path.name: path.stat().st_mtime_ns for path in shards}
    reference = rows(load_corpus(ArtifactPaths.from_params(load_all(params))))
    shards[1].write_text(shards[1].read_text()[:50])  # a kill/disk-full mid-write of that shard
    (tmp_path / "artifacts" / ".corpus.leftover.tmp").mkdir()  # a temp dir a SIGKILL left behind
    process = stage(params)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    assert shards[1].name in err and "is damaged or stale; regenerating only that shard" in " ".join(err.split())
    after = {path.name: path.stat().st_mtime_ns for path in sorted(shard_dir.iterdir())}
    assert [name for name in before if before[name] != after[name]] == [shards[1].name]
    assert rows(load_corpus(ArtifactPaths.from_params(load_all(params)))) == reference
    assert not list((tmp_path / "artifacts").glob(".corpus.*.tmp"))


def test_too_few_prompts_for_every_split_is_refused_before_generation(tmp_path):
    params = make_project(tmp_path, prompts=2)
    process = stage(params)
    assert_one_line_error(process, "leave split(s)")
    assert not (tmp_path / "artifacts" / "corpus").exists()
    assert not (tmp_path / "artifacts" / "corpus_shards").exists()


def test_token_ids_outside_the_vocabulary_are_refused_at_load(tmp_path):
    from datasets import Dataset, DatasetDict

    row = {column: "x" for column in COLUMNS} | {"prompt_ids": [1, 2], "response_ids": [3, 500],
                                                 "temperature": 0.0, "seed": 0}
    paths = ArtifactPaths(root=tmp_path, metrics=tmp_path, plots=tmp_path)
    split = Dataset.from_list([row])
    DatasetDict(train=split, validation=split, test=split).save_to_disk(str(paths.corpus))
    load_corpus(paths, vocab_size=501)
    expected = "'response_ids' has token ids in \\[3, 500\\], outside the verifier's vocabulary of 320"
    with pytest.raises(DraftlineError, match=expected):
        load_corpus(paths, vocab_size=320)


def test_fingerprint_changes_with_params_and_verifier():
    base = CorpusConfig()
    key = fingerprint("hash1", base, [])
    assert fingerprint("hash1", CorpusConfig(), []) == key
    assert fingerprint("hash2", base, []) != key
    assert fingerprint("hash1", CorpusConfig(max_new_tokens=base.max_new_tokens + 1), []) != key
    assert fingerprint("hash1", CorpusConfig(sampling={"temperature": 0.5}), []) != key
