"""`draftline features estimate`: the disk `extract_features` needs for a verifier and a corpus, per
`features.dtype`, before anything is extracted.

From the verifier's `config.json` alone (`hidden_size` and `num_hidden_layers`, or those of its `text_config`):
no weights are loaded and no model code runs. The layers are those each kind reads under this project's
`train.<kind>` settings, plus the last, which every feature set holds (`stored_layers`); the bytes a token
costs are the store's own (`token_bytes`). Tokens: `--tokens N`, or a corpus `stats.json` (its prompt and
response tokens, at most `features.max_seq_len` a row, as extraction cuts rows).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence, get_args

from pipeline.cli import positive_int_arg, run_stage, stage_parser
from pipeline.config.features_config import FeatureDType, FeaturesConfig, offline_kinds, stored_layers
from pipeline.config.stage_params import StageParams
from pipeline.config.train_config import TrainConfig
from pipeline.drafters.registry import KIND_SPECS
from pipeline.errors import DraftlineError
from pipeline.features.store import token_bytes
from pipeline.progress import print_columns


class EstimateParams(StageParams):
    features: FeaturesConfig = FeaturesConfig()
    train: TrainConfig = TrainConfig()


def read_json(path: Path, what: str, fix: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DraftlineError(f"{path}: not found; {fix}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DraftlineError(f"{path}: not a readable {what} ({type(error).__name__}); {fix}") from None
    if not isinstance(data, dict):
        raise DraftlineError(f"{path}: not a {what} (a JSON object); {fix}")
    return data


def _positive_ints(data: dict, keys: tuple[str, ...]) -> tuple[int, ...] | None:
    values = tuple(data.get(key) for key in keys)
    valid = all(isinstance(value, int) and not isinstance(value, bool) and value > 0 for value in values)
    return values if valid else None


def verifier_size(location: Path) -> tuple[int, int]:
    """(num_hidden_layers, hidden_size) from a model directory's config.json (or that file itself)."""
    path = location / "config.json" if location.is_dir() else location
    fix = "pass the verifier's model directory (or its config.json)"
    config = read_json(path, "HF model config", fix)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    size = _positive_ints(text, ("num_hidden_layers", "hidden_size"))
    if size is None:
        raise DraftlineError(f"{path}: no positive integer num_hidden_layers and hidden_size (in it or its "
                             f"text_config); {fix}")
    return size


def corpus_tokens(stats_path: Path, max_seq_len: int) -> int:
    """The tokens extraction stores for a corpus: each row's prompt and response, cut at `max_seq_len`; from its
    totals, so at most that (rows shorter than `max_seq_len` never give back what longer ones lose)."""
    fix = "pass the stats.json build_corpus writes beside the corpus, or --tokens N"
    stats = read_json(stats_path, "corpus stats.json", fix)
    counts = _positive_ints(stats, ("rows", "prompt_tokens", "response_tokens"))
    if counts is None:
        raise DraftlineError(f"{stats_path}: no positive integer rows, prompt_tokens and response_tokens; {fix}")
    rows, prompt, response = counts
    return min(prompt + response, rows * max_seq_len)


def human_bytes(count: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while count >= 1024 and power < len(units) - 1:
        count, power = count / 1024, power + 1
    return f"{count:.0f} B" if power == 0 else f"{count:.1f} {units[power]}"


def estimate_rows(params: EstimateParams, depth: int) -> list[tuple[str, list[int]]]:
    """(what, stored layers): each kind trained offline alone, then the kinds params train offline together
    (what extract_features stores for this project)."""
    rows = [(name, stored_layers(params.train, [name], depth)) for name in KIND_SPECS]
    together = offline_kinds(params.train)
    if len(together) > 1:
        rows.append(("+".join(together) + " (params)", stored_layers(params.train, together, depth)))
    return rows


def run(params: EstimateParams, args: argparse.Namespace) -> None:
    depth, hidden = verifier_size(Path(args.verifier))
    if args.tokens is not None:
        tokens, source = args.tokens, "--tokens"
    else:
        tokens = corpus_tokens(Path(args.corpus_stats), params.features.max_seq_len)
        source = f"{args.corpus_stats}, at most features.max_seq_len {params.features.max_seq_len} a row"
    dtypes: tuple[FeatureDType, ...] = get_args(FeatureDType)
    print(f"verifier {args.verifier}: {depth} layers x {hidden}; corpus {tokens:,} tokens ({source})")
    print("bytes a token = for the corpus (plus 16 bytes a row and a few KiB a shard), by features.dtype:")
    table = [("kinds", "layers", *dtypes)]
    for what, layers in estimate_rows(params, depth):
        sizes = [token_bytes(dtype, hidden, len(layers)) for dtype in dtypes]
        table.append((what, ",".join(map(str, layers)),
                      *(f"{size:,} B = {human_bytes(size * tokens)}" for size in sizes)))
    print_columns(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline features", "Disk the verifier's features need, per features.dtype.")
    parser.add_argument("action", choices=["estimate"])
    parser.add_argument("verifier", help="the verifier's model directory, or its config.json")
    tokens = parser.add_mutually_exclusive_group(required=True)
    tokens.add_argument("--tokens", type=positive_int_arg, help="tokens in the corpus (prompt + response, cut rows)")
    tokens.add_argument("--corpus-stats", metavar="STATS_JSON",
                        help="a corpus's stats.json (artifacts/corpus/stats.json after build_corpus)")
    return run_stage(parser, EstimateParams, run, argv)


if __name__ == "__main__":
    sys.exit(main())
