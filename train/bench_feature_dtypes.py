"""What each `features.dtype` saves and costs on the demo, from one run: bytes/token, extraction tokens/s,
training steps/s and the trained drafters' τ at every evaluate temperature (the demo's: T=0 and T=0.8), every
kind trained offline; each number also as a ratio to the first dtype's (float32 by default).

`python -m train.bench_feature_dtypes [--dtypes float32,bfloat16,float16,float8_e4m3] [--steps N] [--prompts N]
[--out FILE]`

After `make demo`: per dtype, a scratch project with the project's verifier, corpus and params.yaml (only
`features.dtype` set and every kind `features: offline`) runs the real stages, each as its own process:
extract_features, train_<kind> for every kind, evaluate (with `timing_repeats: 1` and no peer baseline: τ is
measured here, not speed). `--steps` caps every kind's `trainer.max_steps` and `--prompts` sets
`evaluate.prompts_per_domain`, for a quick run; by default the project's own recipe runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence, get_args

import yaml

from pipeline.atomic import write_json_atomic
from pipeline.cli import positive_int_arg, run_stage, stage_parser
from pipeline.config.features_config import FeatureDType
from pipeline.config.schema import parse_all
from pipeline.config.stage_params import StageParams
from pipeline.drafters.registry import KIND_SPECS
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.progress import info, print_columns
from pipeline.verifier_record import RECORD_NAME
from train.bench_features import run_measured

DTYPES: tuple[str, ...] = get_args(FeatureDType)


class BenchParams(StageParams):
    """Only `project`: where the demo's verifier and corpus are; the scratch projects take the whole params.yaml."""


def dtype_list(text: str) -> list[str]:
    """argparse type: comma-separated feature dtypes, the first the baseline."""
    dtypes = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in dtypes if name not in DTYPES]
    if not dtypes or unknown or len(set(dtypes)) != len(dtypes):
        raise argparse.ArgumentTypeError(f"expected distinct names of {', '.join(DTYPES)}, got {text!r}")
    return dtypes


def scratch_params(project: dict, root: Path, dtype: str, steps: int | None, prompts: int | None) -> dict:
    """The project's params with this scratch project's paths and MLflow store, `dtype`, every kind offline."""
    params = copy.deepcopy(project)
    params["project"] = {**params.get("project", {}), "artifacts_dir": str(root / "artifacts"),
                         "metrics_dir": str(root / "metrics"), "plots_dir": str(root / "plots")}
    params["tracking"] = {**params.get("tracking", {}), "uri": f"sqlite:///{root / 'mlflow.db'}"}
    params["features"] = {**params.get("features", {}), "dtype": dtype}
    train = params.setdefault("train", {})
    for kind in KIND_SPECS:
        section = train.setdefault(kind, {})
        section["features"] = "offline"
        if steps is not None:
            trainer = section.setdefault("trainer", {})
            trainer.update(max_steps=steps, epochs=None, warmup_steps=min(trainer.get("warmup_steps", 20), steps // 4))
    params["evaluate"] = {**params.get("evaluate", {}), "timing_repeats": 1, "peer_baseline": False,
                          **({"prompts_per_domain": prompts} if prompts else {})}
    parse_all(params)  # a combination the schema refuses is one line here, before any stage runs
    return params


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def measure(dtype: str, root: Path, source: ArtifactPaths, params: dict) -> dict:
    """One dtype's numbers, from the metrics its stages wrote."""
    (root / "artifacts").mkdir(parents=True)
    shutil.copytree(source.verifier, root / "artifacts" / "verifier", symlinks=True)
    shutil.copytree(source.corpus, root / "artifacts" / "corpus")
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    metrics = root / "metrics"

    def stage(module: str, *args: str) -> None:
        info(f"{dtype}: {module} {' '.join(args)}".rstrip())
        run_measured([sys.executable, "-m", module, *args], root)

    stage("data_prep.extract_features")
    features = json.loads((metrics / "features.json").read_text())
    result = {"bytes_per_token": features["bytes_per_token"], "extract_tokens_per_s": features["tokens_per_s"],
              "steps_per_s": {}, "tau": {}}
    for kind in KIND_SPECS:
        stage("train.dispatch", "--drafter", kind)
        trained = json.loads((metrics / f"train_{kind}.json").read_text())
        result["steps_per_s"][kind] = trained["steps"] / trained["fit_time_s"]
    stage("serve_eval.evaluate")
    evaluated = json.loads((metrics / "eval.json").read_text())
    for kind, entry in evaluated["drafters"].items():
        # per temperature: τ per domain, and their mean (what the ratios compare)
        result["tau"][kind] = {key: {"mean": mean(cell["tau"] for cell in domains.values()),
                                     **{domain: cell["tau"] for domain, cell in domains.items()}}
                               for key, domains in entry["by_temperature"].items()}
    return result


def with_ratios(results: dict[str, dict], baseline: str) -> None:
    """Each number's ratio to the baseline dtype's, beside it (`*_vs_<baseline>`)."""
    base = results[baseline]
    for result in results.values():
        result["ratios"] = {
            "bytes_per_token": result["bytes_per_token"] / base["bytes_per_token"],
            "extract_tokens_per_s": result["extract_tokens_per_s"] / base["extract_tokens_per_s"],
            "steps_per_s": {kind: value / base["steps_per_s"][kind] for kind, value in result["steps_per_s"].items()},
            "tau": {kind: {key: cell["mean"] / base["tau"][kind][key]["mean"] for key, cell in by_t.items()}
                    for kind, by_t in result["tau"].items()},
        }


def print_table(results: dict[str, dict], baseline: str) -> None:
    """One row per dtype and kind; in brackets each number's ratio to the baseline's; τ is the mean over domains."""
    temperatures = list(next(iter(results.values()))["tau"][next(iter(KIND_SPECS))])
    rows = [("dtype", "kind", "bytes/token", "extract tok/s", "train steps/s", *(f"tau T={key}" for key in temperatures))]
    for dtype, result in results.items():
        ratios = result["ratios"]
        for index, kind in enumerate(KIND_SPECS):
            per_dtype = (f"{result['bytes_per_token']:,.0f} ({ratios['bytes_per_token']:.2f}x)",
                         f"{result['extract_tokens_per_s']:,.0f} ({ratios['extract_tokens_per_s']:.2f}x)")
            rows.append((dtype if index == 0 else "", kind, *(per_dtype if index == 0 else ("", "")),
                         f"{result['steps_per_s'][kind]:.2f} ({ratios['steps_per_s'][kind]:.2f}x)",
                         *(f"{result['tau'][kind][key]['mean']:.3f} ({ratios['tau'][kind][key]:.3f}x)"
                           for key in temperatures)))
    print(f"features.dtype on this project, each kind trained offline; (x): ratio to {baseline}")
    print_columns(rows)


def run(params: BenchParams, args: argparse.Namespace) -> dict:
    source = ArtifactPaths.from_params(params)
    if not (source.verifier / RECORD_NAME).is_file() or not source.corpus.is_dir():
        raise DraftlineError(f"no verifier or corpus under {source.root}; run `make demo` (or `dvc repro "
                             "build_corpus`) first")
    project = yaml.safe_load(Path(args.params).read_text(encoding="utf-8")) or {}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="draftline-bench-dtypes-") as scratch:
        for dtype in args.dtypes:
            root = Path(scratch) / dtype
            results[dtype] = measure(dtype, root, source, scratch_params(project, root, dtype, args.steps, args.prompts))
    with_ratios(results, args.dtypes[0])
    print_table(results, args.dtypes[0])
    if args.out:
        write_json_atomic(Path(args.out), {"baseline": args.dtypes[0], "steps": args.steps,
                                           "prompts_per_domain": args.prompts, "dtypes": results})
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("python -m train.bench_feature_dtypes",
                          "bytes/token, extraction tokens/s, training steps/s and τ per features.dtype")
    parser.add_argument("--dtypes", type=dtype_list, default=list(DTYPES),
                        help=f"comma-separated, the first the baseline (default {','.join(DTYPES)})")
    parser.add_argument("--steps", type=positive_int_arg, default=None,
                        help="cap every kind's trainer.max_steps (default: the params' own)")
    parser.add_argument("--prompts", type=positive_int_arg, default=None, help="evaluate.prompts_per_domain")
    parser.add_argument("--out", default=None, help="also write the results here (JSON)")
    return run_stage(parser, BenchParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
