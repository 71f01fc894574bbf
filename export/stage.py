"""Stage `export`: serving checkpoints, ONNX with ONNX Runtime parity, TensorRT engines, manifests.

For each kind in params.export.kinds it reads `artifacts/drafters/<kind>` and the verifier and
writes `artifacts/export/<kind>/` atomically: a failed validation, export or parity check leaves the
previous export untouched.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from data_prep.corpus import load_corpus
from data_prep.verifier import check_same_tokenizer, load_verifier, model_location, read_record, verifier_identity
from export import onnx_export, parity, serving, tensorrt_build
from export.manifest import MANIFEST_NAME, build_manifest
from export.validate import validate_causal_lm, validate_dflash
from pipeline.atomic import atomic_dir, write_json_atomic, write_text_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config import Params
from pipeline.errors import DraftlineError
from pipeline.integrity import check_drafter_matches_verifier
from pipeline.lineage import git_commit, hash_dir, read_json
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary

PARITY_NAME = "parity.json"


def _drafter_lineage(drafter_dir: Path, params: Params) -> dict:
    training = drafter_dir / "training.json"
    recorded = read_json(training).get("lineage", {}) if training.is_file() else {}
    return {**recorded, "drafter_hash": hash_dir(drafter_dir), "export_params_hash": params.section_hash("export"),
            "export_git_commit": git_commit()}


def _serving_verifier(paths: ArtifactPaths) -> str:
    """What the launch snippets load as the target: an absolute local dir, or the HF model name."""
    location = model_location(paths, read_record(paths))
    return str(Path(location).resolve()) if Path(location).exists() else location


def _parity_texts(params: Params, paths: ArtifactPaths) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, response_ids) of the first test prompts of the corpus."""
    test = load_corpus(paths)["test"]
    count = min(params.export.parity_prompts, len(test))
    if count == 0:
        raise DraftlineError(f"corpus test split at {paths.corpus} is empty; rebuild it with `dvc repro build_corpus`")
    rows = test.select(range(count))
    return [(list(p), list(r)) for p, r in zip(rows["prompt_ids"], rows["response_ids"])]


# --------------------------------------------------------------------------- per kind


def _export_ar(serving_dir: Path, out: Path, params: Params, texts):
    model = AutoModelForCausalLM.from_pretrained(serving_dir, dtype=torch.float32).eval().requires_grad_(False)
    spec = onnx_export.ar_io_spec(model.config)
    wrapper = onnx_export.ARDecodeWrapper(model).eval()
    generator = torch.Generator().manual_seed(params.project.seed)
    example = parity.ar_feeds(spec, torch.randint(0, spec.sizes["vocab_size"], (2, 3), generator=generator),
                              parity.random_past(spec, 2, 5, generator))
    path = onnx_export.export_onnx(wrapper, spec, example, out, params.export.opset, params.export.exporter)
    prompts = [prompt for prompt, _ in texts]
    report = parity.ar_parity(wrapper, parity.ort_session(path), spec, prompts, params.export.parity_steps,
                              params.export.atol, params.export.rtol, params.project.seed)
    return wrapper, spec, path, report


def _export_block(serving_dir: Path, out: Path, params: Params, texts, verifier: PreTrainedModel):
    from train.block_model import DFlashDraftModel  # lazy: only this kind needs the train package

    model = DFlashDraftModel.from_pretrained(serving_dir, dtype=torch.float32).eval().requires_grad_(False)
    embed, lm_head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    spec = onnx_export.block_io_spec(model, verifier.config.get_text_config().vocab_size)
    wrapper = onnx_export.BlockDraftWrapper(model, embed, lm_head).eval()
    generator = torch.Generator().manual_seed(params.project.seed)
    example = parity.block_random_feeds(spec, 2, 5, 3, generator)
    path = onnx_export.export_onnx(wrapper, spec, example, out, params.export.opset, params.export.exporter)
    contexts = []
    with torch.no_grad():
        for prompt, response in texts:
            ids = prompt + response
            hidden = verifier(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
            contexts.append((model.fuse_target_hidden(hidden), ids))
    reference = parity.BlockReference(model, embed, lm_head)
    report = parity.block_parity(reference, parity.ort_session(path), spec, contexts, params.export.parity_steps,
                                 params.export.atol, params.export.rtol, params.project.seed)
    return wrapper, spec, path, report


def _tensorrt(kind: str, wrapper, spec, onnx_path: Path, out: Path, params: Params,
              skip_reason: str | None) -> tuple[dict | None, str | None]:
    """Build the engine and run it once against ONNX Runtime; returns (engine record, skip reason)."""
    if skip_reason:
        return None, skip_reason
    plan = tensorrt_build.precision_plan(params.export.trt_precision, tensorrt_build.tensorrt_major())
    feeds = parity.opt_feeds(kind, spec, params.export.profile, params.project.seed)
    build_onnx, build_spec = onnx_path, spec
    if plan.onnx_dtype != "float32":  # strongly typed: the graph itself carries the precision
        dtype = getattr(torch, plan.onnx_dtype)
        low = copy.deepcopy(wrapper).to(dtype)  # a copy: the verifier's embedding/LM head stay fp32
        build_spec = onnx_export.with_float_dtype(spec, plan.onnx_dtype)
        example = {n: t.to(dtype) if t.is_floating_point() else t for n, t in feeds.items()}
        build_onnx = onnx_export.export_onnx(low, build_spec, example, out / f"onnx_{plan.onnx_dtype}",
                                             params.export.opset, params.export.exporter)
    engine = tensorrt_build.build_engine(build_onnx, build_spec, params.export, plan,
                                         out / tensorrt_build.ENGINE_NAME)
    expected = parity.ort_session(onnx_path).run(spec.output_names, {n: t.numpy() for n, t in feeds.items()})
    got = tensorrt_build.run_engine(engine, build_spec, feeds)
    check = parity.ParityReport(params.export.atol, params.export.rtol)
    check.add("engine vs onnxruntime at the opt profile shapes", spec.output_names, expected, got)
    profiles = tensorrt_build.profile_shapes(build_spec, params.export.profile)
    return {"path": engine.name, "precision": params.export.trt_precision, "onnx": build_onnx.relative_to(out).as_posix(),
            "tensorrt_version": tensorrt_build.tensorrt_version(), "strongly_typed": plan.strongly_typed,
            "builder_flags": list(plan.builder_flags),
            "profiles": {name: [list(shape) for shape in shapes] for name, shapes in profiles.items()},
            "parity_vs_onnxruntime": check.to_json()["outputs"]}, None


def export_kind(kind: str, params: Params, paths: ArtifactPaths, verifier, verifier_tok, identity: dict,
                texts, trt_skip: str | None) -> dict:
    drafter_dir = paths.drafter(kind)
    target = paths.export(kind)
    check_drafter_matches_verifier(drafter_dir, verifier.config, f"{kind} drafter at {drafter_dir}",
                                   f"retrain it (`dvc repro train_{kind}`)")
    with atomic_dir(target) as out:
        serving_dir = out / serving.SERVING_DIR
        serving.copy_checkpoint(drafter_dir, serving_dir)
        config = validate_causal_lm(serving_dir) if kind == "ar" else validate_dflash(serving_dir)
        check_same_tokenizer(verifier_tok, AutoTokenizer.from_pretrained(serving_dir), f"{kind} drafter")
        launch = serving.launch_info(kind, config, _serving_verifier(paths), (target / serving.SERVING_DIR).resolve(),
                                     params.evaluate.ar_draft_tokens)
        write_text_atomic(out / serving.LAUNCH_NAME, serving.launch_markdown(kind, launch))

        if kind == "ar":
            wrapper, spec, onnx_path, report = _export_ar(serving_dir, out, params, texts)
        else:
            wrapper, spec, onnx_path, report = _export_block(serving_dir, out, params, texts, verifier)
        write_json_atomic(out / PARITY_NAME, report.to_json())
        if not report.passed:
            raise DraftlineError(f"{kind} drafter: ONNX Runtime differs from PyTorch beyond atol={report.atol} "
                                 f"rtol={report.rtol}: {', '.join(report.failures())}; check the export or loosen "
                                 "export.atol/export.rtol in params.yaml")
        engine, skip_reason = _tensorrt(kind, wrapper, spec, onnx_path, out, params, trt_skip)
        skipped = {"tensorrt": skip_reason} if skip_reason else {}
        manifest = build_manifest(kind=kind, out_dir=out, serving_dir=serving_dir, spec=spec,
                                  opset=params.export.opset, exporter=params.export.exporter, verifier=identity,
                                  lineage=_drafter_lineage(drafter_dir, params), parity=report.to_json(),
                                  skipped=skipped, tensorrt=engine)
        write_json_atomic(out / MANIFEST_NAME, manifest)
    worst = report.outputs["logits"]
    return {f"{kind} logits max abs": worst["max_abs"], f"{kind} logits max rel": worst["max_rel"],
            f"{kind} parity cases": len(report.cases), f"{kind} tensorrt": "built" if engine else f"skipped ({skip_reason})"}


def run(params: Params, args: argparse.Namespace) -> None:
    paths = ArtifactPaths.from_params(params)
    trt_skip = tensorrt_build.check_tensorrt_mode(params.export)  # `required` fails before any work
    for kind in params.export.kinds:
        if not (paths.drafter(kind) / "config.json").is_file():
            raise DraftlineError(f"no {kind} drafter at {paths.drafter(kind)}; run `dvc repro train_{kind}` "
                                 f"(or remove '{kind}' from export.kinds)")
    identity = verifier_identity(paths)
    verifier, verifier_tok = load_verifier(paths, trust_remote_code=params.verifier.trust_remote_code)
    texts = _parity_texts(params, paths)
    summary: dict[str, object] = {}
    for kind in params.export.kinds:
        info(f"export: {kind} drafter")
        summary.update(export_kind(kind, params, paths, verifier, verifier_tok, identity, texts, trt_skip))
    print_summary("export", summary)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline export", "serving checkpoints, ONNX with parity, TensorRT engines")
    return run_stage(parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
