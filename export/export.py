"""Stage `export`: serving checkpoints, ONNX with ONNX Runtime parity, TensorRT engines, manifests.

For each kind in params.export.kinds it reads `artifacts/drafters/<kind>` and the verifier and
writes `artifacts/export/<kind>/` atomically: a failed validation, export or parity check leaves the
previous export untouched.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import torch

from data_prep.corpus import load_corpus
from data_prep.verifier import load_verifier
from export import gguf_files, launch_files, tensorrt_build
from export.manifest import build_manifest
from pipeline.atomic import atomic_dir, write_json_atomic, write_text_atomic
from pipeline.cli import run_stage, stage_parser
from pipeline.config.export_config import ExportConfig
from pipeline.config.stage_params import StageParams
from pipeline.config.verifier_config import VerifierConfig
from pipeline.drafters.interface import DrafterKind, OnnxExport, OnnxJob
from pipeline.drafters.kinds import KINDS
from pipeline.drafters.onnx_io import MANIFEST_NAME, ParityReport, export_onnx, ort_session, run_session
from pipeline.drafters.onnx_spec import with_float_dtype
from pipeline.errors import DraftlineError
from pipeline.integrity import (
    check_drafter_matches_verifier,
    check_same_tokenizer,
    load_tokenizer,
    refuse_non_finite_weights,
)
from pipeline.lineage import git_commit, library_versions, model_identity, read_json
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_summary
from pipeline.verifier_record import model_location, read_record, verifier_identity


class ExportParams(StageParams):
    verifier: VerifierConfig = VerifierConfig()
    export: ExportConfig = ExportConfig()

PARITY_NAME = "parity.json"


def _drafter_lineage(drafter_dir: Path, params: ExportParams) -> dict:
    training = drafter_dir / "training.json"
    recorded = read_json(training).get("lineage", {}) if training.is_file() else {}
    return {**recorded, "drafter_hash": model_identity(drafter_dir), "export_params_hash": params.section_hash("export"),
            "export_git_commit": git_commit(), "export_library_versions": library_versions()}


def _serving_verifier(paths: ArtifactPaths) -> str:
    """What the launch snippets load as the target: an absolute local dir, or the HF model name."""
    location = model_location(paths, read_record(paths))
    return str(Path(location).resolve()) if Path(location).exists() else location


def _verifier_dir(paths: ArtifactPaths) -> Path:
    """The verifier's checkpoint dir, which llama.cpp's converter reads: the local dir, or an HF model's cached snapshot."""
    location = model_location(paths, read_record(paths))
    if Path(location).is_dir():
        return Path(location)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(location, local_files_only=True))


def _parity_texts(params: ExportParams, paths: ArtifactPaths) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, response_ids) of the first test prompts of the corpus."""
    test = load_corpus(paths)["test"]
    count = min(params.export.parity_prompts, len(test))
    if count == 0:
        raise DraftlineError(f"corpus test split at {paths.corpus} is empty; rebuild it with `dvc repro build_corpus`")
    rows = test.select(range(count))
    return [(list(p), list(r)) for p, r in zip(rows["prompt_ids"], rows["response_ids"])]


def _tensorrt(kind: DrafterKind, exported: OnnxExport, out: Path, params: ExportParams,
              skip_reason: str | None) -> tuple[dict | None, str | None]:
    """Build the engine and run it once against ONNX Runtime; returns (engine record, skip reason)."""
    if skip_reason:
        return None, skip_reason
    spec = exported.spec
    plan = tensorrt_build.precision_plan(params.export.trt_precision, tensorrt_build.tensorrt_major())
    feeds = kind.opt_feeds(spec, params.export.profile, params.project.seed)
    build_onnx, build_spec = exported.path, spec
    if plan.onnx_dtype != "float32":  # strongly typed: the graph itself carries the precision
        dtype = getattr(torch, plan.onnx_dtype)
        low = copy.deepcopy(exported.wrapper).to(dtype)  # a copy: the verifier's embedding/LM head stay fp32
        build_spec = with_float_dtype(spec, plan.onnx_dtype)
        example = {n: t.to(dtype) if t.is_floating_point() else t for n, t in feeds.items()}
        build_onnx = export_onnx(low, build_spec, example, out / f"onnx_{plan.onnx_dtype}", params.export.opset,
                                 params.export.exporter)
    engine = tensorrt_build.build_engine(build_onnx, build_spec, params.export, plan,
                                         out / tensorrt_build.ENGINE_NAME)
    expected = run_session(ort_session(exported.path), spec, feeds)
    got = tensorrt_build.run_engine(engine, build_spec, feeds)
    check = ParityReport(params.export.atol, params.export.rtol)
    check.add("engine vs onnxruntime at the opt profile shapes", spec.output_names, expected, got)
    profiles = tensorrt_build.profile_shapes(build_spec, params.export.profile)
    return {"path": engine.name, "precision": params.export.trt_precision, "onnx": build_onnx.relative_to(out).as_posix(),
            "tensorrt_version": tensorrt_build.tensorrt_version(), "strongly_typed": plan.strongly_typed,
            "builder_flags": list(plan.builder_flags),
            "profiles": {name: [list(shape) for shape in shapes] for name, shapes in profiles.items()},
            "parity_vs_onnxruntime": check.to_json()["outputs"]}, None


def export_serving(kind: DrafterKind, drafter_dir: Path, out: Path, target: Path, verifier: str, verifier_tok,
                   artifacts: Path, gguf_skip: str | None = None) -> dict:
    """`serving/` (checked as the serving stacks load it), `launch.md` and `vllm.json` under `out`, which
    becomes `target`; returns the served config. `gguf_skip`: why no GGUF files are written (launch.md says it)."""
    serving_dir = out / launch_files.SERVING_DIR
    launch_files.copy_checkpoint(drafter_dir, serving_dir)
    config = kind.serving_layout(serving_dir)
    what = f"{kind.name} drafter"
    check_same_tokenizer(verifier_tok, load_tokenizer(serving_dir, what, f"retrain it (`dvc repro train_{kind.name}`)"), what)
    launch = kind.launch(config, verifier, (target / launch_files.SERVING_DIR).resolve(), drafter_dir)
    llamacpp = launch_files.llamacpp_section(kind.name, launch, target, verifier, gguf_skip)
    write_text_atomic(out / launch_files.LAUNCH_NAME, f"{launch.markdown.rstrip()}\n\n{llamacpp}")
    job = launch_files.relocatable_job(launch_files.vllm_job(verifier, launch), target, artifacts)
    write_json_atomic(out / launch_files.VLLM_NAME, job)
    return config


def export_kind(kind: DrafterKind, params: ExportParams, paths: ArtifactPaths, verifier, verifier_tok, identity: dict,
                texts, trt_skip: str | None, verifier_gguf: dict | None, gguf_skip: str | None) -> dict:
    drafter_dir = paths.drafter(kind.name)
    target = paths.export(kind.name)
    with atomic_dir(target) as out:
        serving_dir = out / launch_files.SERVING_DIR
        export_serving(kind, drafter_dir, out, target, _serving_verifier(paths), verifier_tok, paths.root, gguf_skip)
        # llama.cpp's converter is another process that reads only serving/, and tracing the ONNX graph keeps one
        # core busy at most: side by side they take the time of the longer, not the sum (-17 s of the demo's 84 s)
        with ThreadPoolExecutor(max_workers=1) as converter:
            gguf = None if verifier_gguf is None else converter.submit(
                gguf_files.convert_drafter, kind.name, serving_dir, out, _verifier_dir(paths), params.export.gguf)
            exported = kind.export_onnx(OnnxJob(kind.name, drafter_dir, serving_dir, out, params.export,
                                                params.project.seed, texts, verifier))
            if gguf is not None:
                gguf.result()  # the converter's one-line error, if it failed
        report = exported.parity
        write_json_atomic(out / PARITY_NAME, report.to_json())
        if not report.passed:
            raise DraftlineError(f"{kind.name} drafter: ONNX Runtime differs from PyTorch beyond atol={report.atol} "
                                 f"rtol={report.rtol}: {', '.join(report.failures())}; check the export or loosen "
                                 "export.atol/export.rtol in params.yaml")
        engine, skip_reason = _tensorrt(kind, exported, out, params, trt_skip)
        skipped = {name: reason for name, reason in (("tensorrt", skip_reason), ("gguf", gguf_skip)) if reason}
        manifest = build_manifest(kind=kind.name, out_dir=out, serving_dir=serving_dir, spec=exported.spec,
                                  opset=params.export.opset, exporter=params.export.exporter, verifier=identity,
                                  lineage=_drafter_lineage(drafter_dir, params), parity=report.to_json(),
                                  skipped=skipped, tensorrt=engine,
                                  gguf=gguf_files.manifest_record(verifier_gguf, params.export.gguf) if verifier_gguf else None)
        write_json_atomic(out / MANIFEST_NAME, manifest)
    worst = report.outputs["logits"]
    name = kind.name
    return {f"{name} logits max abs": worst["max_abs"], f"{name} logits max rel": worst["max_rel"],
            f"{name} parity cases": len(report.cases), f"{name} tensorrt": "built" if engine else f"skipped ({skip_reason})"}


def remove_unexported(paths: ArtifactPaths, kinds: list[str]) -> None:
    """DVC leaves `export/` in place while this stage runs (a failed run keeps the last good exports), so a
    kind dropped from export.kinds is removed here, once every listed kind is written."""
    for stale in (paths.root / "export").iterdir():
        if stale.name not in kinds and stale.is_dir() and not stale.name.startswith("."):
            shutil.rmtree(stale)


def run(params: ExportParams, args: argparse.Namespace) -> None:
    paths = ArtifactPaths.from_params(params)
    trt_skip = tensorrt_build.check_tensorrt_mode(params.export)  # `required` fails before any work
    kinds = [KINDS[name] for name in params.export.kinds]
    for kind in params.export.kinds:
        if not (paths.drafter(kind) / "config.json").is_file():
            raise DraftlineError(f"no {kind} drafter at {paths.drafter(kind)}; run `dvc repro train_{kind}` "
                                 f"(or remove '{kind}' from export.kinds)")
    identity = verifier_identity(paths)
    verifier, verifier_tok = load_verifier(paths, trust_remote_code=params.verifier.trust_remote_code,
                                           allow_pickle_weights=params.verifier.allow_pickle_weights)
    for kind in kinds:  # every drafter refused now, before the verifier's GGUF is written under the export dir
        drafter_dir = paths.drafter(kind.name)
        check_drafter_matches_verifier(drafter_dir, verifier.config, f"{kind.name} drafter at {drafter_dir}",
                                       f"retrain it (`dvc repro train_{kind.name}`)")
        refuse_non_finite_weights(drafter_dir, f"{kind.name} drafter at {drafter_dir}",
                                  f"retrain it (`dvc repro train_{kind.name}`)")
    texts = _parity_texts(params, paths)
    gguf_skip = gguf_files.skip_reason()
    verifier_gguf = None
    if gguf_skip is None:
        info("export: the verifier to GGUF (for llama.cpp)")
        verifier_gguf = gguf_files.convert_verifier(_verifier_dir(paths), paths.root / "export", params.export.gguf)
    summary: dict[str, object] = {"gguf": f"skipped ({gguf_skip})" if gguf_skip else "written"}
    for kind in kinds:
        info(f"export: {kind.name} drafter")
        summary.update(export_kind(kind, params, paths, verifier, verifier_tok, identity, texts, trt_skip,
                                   verifier_gguf, gguf_skip))
    remove_unexported(paths, params.export.kinds)
    print_summary("export", summary)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline export", "serving checkpoints, ONNX with parity, TensorRT engines")
    return run_stage(parser, ExportParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
