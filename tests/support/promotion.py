"""A project dir ready for stage `promote`: fake inputs that follow the contracts (eval.json, training.json,
export manifest, dvc.lock) around a real tiny AR checkpoint, tracked in a shared temporary MLflow store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

from pipeline.integrity import measured_artifacts
from pipeline.lineage import model_identity
from pipeline.promote import promote
from pipeline.promote.model_registry import registered_model_name
from pipeline.verifier_record import write_record
from tests.support.tiny_models import tiny_qwen3

EXPERIMENT = "draftline-test"


def domain_metrics(tau: float, speedup: float | None) -> dict:
    return {"acceptance_rate": 0.5, "tau": tau, "speedup": speedup, "tokens_per_s": 900.0,
            "baseline_tokens_per_s": 700.0, "draft_time_s": 0.4, "verify_time_s": 1.0,
            "per_position_acceptance": [0.8, 0.6, 0.5], "prompts": 4}


def drafter_eval(code_tau: float, text_tau: float, speedup: float | None = 1.3, sampled: dict | None = None) -> dict:
    """An evaluation at T=0 and T=0.8 (evaluate's default temperatures): `sampled` (domain -> metrics) is
    what the drafter measured at T=0.8, else the same as at T=0."""
    greedy = {"code": domain_metrics(code_tau, speedup), "text": domain_metrics(text_tau, speedup)}
    return {"backend": "torch", "lossless": True, "mismatches": 0,
            "by_temperature": {"0.0": greedy, "0.8": sampled or greedy}}


class Workspace:
    """A project dir (params.yaml, artifacts/, metrics/) whose tracking URI is the shared temp store."""

    def __init__(self, root: Path, store_uri: str, verifier_id: str, tokenizer_dir: Path):
        self.root = root
        self.tokenizer_dir = tokenizer_dir
        self.params = root / "params.yaml"
        self.params.write_text(yaml.safe_dump({"tracking": {"uri": store_uri, "experiment": EXPERIMENT}, "promote": {
            "model_name_prefix": "dl",
            "gates": {"code": {"min_tau": 1.2, "min_speedup": 1.0}, "text": {"min_tau": 1.1, "min_speedup": 1.0}},
        }, "serve_check": {"required": False}}))  # the vLLM check has its own tests (test_serve_check.py)
        (root / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"train@ar": {
            "cmd": "python -m train.dispatch --drafter ar",
            "deps": [{"path": "artifacts/corpus", "md5": "a" * 32 + ".dir"}],
            "outs": [{"path": "artifacts/drafters/ar", "md5": "b" * 32 + ".dir"}]}}}))
        # promotion hashes the verifier's files (it never loads them): a config naming it is a verifier here
        verifier_dir = root / "artifacts/verifier"
        verifier_dir.mkdir(parents=True, exist_ok=True)
        (verifier_dir / "config.json").write_text(json.dumps({"model_type": "qwen3", "test_verifier": verifier_id}))
        record = write_record(verifier_dir, source="bootstrap", name_or_path=str(verifier_dir), id_prefix=verifier_id)
        self.verifier_id, self.verifier_hash = record["id"], record["hash"]

    def name(self, kind: str) -> str:
        return registered_model_name("dl", self.verifier_id, kind)

    def write_ar_checkpoint(self, seed: int) -> torch.nn.Module:
        serving = self.root / "artifacts/export/ar/serving"
        shutil.rmtree(serving, ignore_errors=True)
        model = tiny_qwen3(320, hidden_size=16, num_layers=1, seed=seed)
        model.save_pretrained(serving)
        shutil.copytree(self.tokenizer_dir, serving, dirs_exist_ok=True)
        (self.root / "artifacts/export/ar/manifest.json").write_text(json.dumps(
            {"files": {}, "skipped": {"tensorrt": "no CUDA device"}, "opset": 18}))
        return model

    def write_block_checkpoint(self) -> None:
        # No export for the block drafter: promotion must fall back to the training output.
        drafter = self.root / "artifacts/drafters/block"
        drafter.mkdir(parents=True, exist_ok=True)
        (drafter / "config.json").write_text(json.dumps({
            "architectures": ["DFlashDraftModel"], "model_type": "dflash", "block_size": 4, "num_target_layers": 2,
            "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 2]}}))
        save_file({"fc.weight": torch.zeros(16, 32), "norm.weight": torch.ones(16)}, drafter / "model.safetensors")

    def write_training(self, kind: str, verifier_hash: str | None = None) -> None:
        path = self.root / f"artifacts/drafters/{kind}/training.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "kind": kind, "steps": 10, "tokens": 1000, "train_loss": 2.0, "val_loss": 2.1,
            "top1_agreement": [0.5], "simulated_acceptance_length": 1.5, "untrained_top1_agreement": [0.1],
            "lineage": {"verifier_id": self.verifier_id, "verifier_hash": verifier_hash or self.verifier_hash,
                        "corpus_hash": "corpus-1", "params_hash": "params-1", "git_commit": "abc123"}}))

    def write_eval(self, drafters: dict) -> None:
        """An evaluation of the artifacts as they are now (each export made from the current drafter)."""
        for kind in drafters:
            manifest = self.root / f"artifacts/export/{kind}/manifest.json"
            if manifest.is_file():
                recorded = json.loads(manifest.read_text())
                recorded["lineage"] = {"drafter_hash": model_identity(self.root / f"artifacts/drafters/{kind}")}
                manifest.write_text(json.dumps(recorded))
        drafters = {kind: {**entry, **self.measured(kind)} for kind, entry in drafters.items()}
        path = self.root / "metrics/eval.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        # json.dumps writes NaN for float('nan'), as an evaluation that broke would
        path.write_text(json.dumps({"verifier": {"id": self.verifier_id, "hash": self.verifier_hash},
                                    "corpus_hash": "corpus-1", "drafters": drafters}))

    def measured(self, kind: str) -> dict:
        return measured_artifacts(self.root / f"artifacts/drafters/{kind}", self.root / f"artifacts/export/{kind}")

    def promote(self) -> dict:
        assert promote.main(["--params", str(self.params)]) == 0
        return json.loads((self.root / "metrics/promotion.json").read_text())


def ready_workspace(root: Path, store: str, verifier_id: str, tokenizer_dir: Path, seed: int = 1,
                    tau: float = 2.0) -> Workspace:
    """A workspace with an AR checkpoint, its training record and an evaluation, ready to promote."""
    ws = Workspace(root, store, verifier_id, tokenizer_dir)
    ws.write_ar_checkpoint(seed=seed)
    ws.write_training("ar")
    ws.write_eval({"ar": drafter_eval(tau, tau)})
    return ws
