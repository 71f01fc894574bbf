"""`draftline registry list|show|promote`: inspect the drafter registry and promote by hand.

`list` and `show` print data (stdout: `draftline registry list | grep block` works); messages go to stderr.

`promote MODEL VERSION` runs the gate (current params) against the current champion; with
`--force --reason TEXT` it skips the gate and records who forced it, when and why as version tags.
MODEL is a registered model name or a drafter kind (any of pipeline/drafters/registry.py, resolved with the
verifier in `metrics/eval.json`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import getpass
import json
import sys
from typing import Sequence

from rich.table import Table

from pipeline.cli import run_stage, stage_parser
from pipeline.config.base import DRAFTER_NAMES
from pipeline.errors import DraftlineError
from pipeline.paths import ArtifactPaths
from pipeline.progress import console, print_data
from pipeline.promote.model_registry import (
    ADOPT_FLAG,
    CHAMPION,
    PREVIOUS_CHAMPION,
    TAG_GATE,
    TAG_GATE_DECISION,
    TAG_GATE_REASONS,
    Registry,
    metrics_from_tags,
    mlflow_errors,
    registered_model_name,
    registry_lock,
    verdicts_from_tags,
    version_number,
)
from pipeline.promote.promote import Evaluation, PromoteParams, comparisons_table, gate_version
from pipeline.tracking import tracking_uri

TAG_FORCED_REASON = "gate.forced_reason"
TAG_FORCED_BY = "gate.forced_by"
TAG_FORCED_AT = "gate.forced_at"


def resolve_model(params: PromoteParams, model: str) -> str:
    if model not in DRAFTER_NAMES:
        return model
    evaluation = Evaluation.load(ArtifactPaths.from_params(params).metrics / "eval.json")
    return registered_model_name(params.promote.model_name_prefix, evaluation.verifier_id, model)


def _aliases(registry: Registry, name: str) -> dict[str, str]:
    return {alias: str(version.version) for alias in (CHAMPION, PREVIOUS_CHAMPION)
            if (version := registry.alias_version(name, alias)) is not None}


def _aliases_of(registry: Registry, name: str, version: str) -> str:
    # search_model_versions leaves `aliases` empty, so resolve the two aliases draftline manages
    return ",".join(alias for alias, held_by in _aliases(registry, name).items() if held_by == str(version)) or "-"


def temperature_verdict(by_domain: dict[str, str]) -> str:
    """One temperature's verdict over its domains: `passed`, or the worst verdict and the domains that got it."""
    for verdict in ("rejected", "undecided"):
        domains = [domain for domain, got in sorted(by_domain.items()) if got == verdict]
        if domains:
            return f"{verdict}: {', '.join(domains)}"
    return "passed"


def list_models(registry: Registry, params: PromoteParams) -> None:
    models = registry.models(params.promote.model_name_prefix)
    if not models:
        console.print(f"no registered drafters named '{params.promote.model_name_prefix}*' yet")
        return
    rows, temperatures = [], set()
    for model in models:
        versions = registry.versions(model.name)
        latest = versions[-1] if versions else None
        verdicts = verdicts_from_tags(latest.tags) if latest else {}
        temperatures.update(verdicts)
        aliases = _aliases(registry, model.name)
        rows.append(([model.name, str(len(versions)), aliases.get(CHAMPION, "-"), aliases.get(PREVIOUS_CHAMPION, "-"),
                      f"v{latest.version} {latest.tags.get(TAG_GATE, '-')}" if latest else "-"], verdicts))
    table = Table(title=f"registered drafters ({registry.uri})", title_justify="left")
    for column in ("model", "versions", "champion", "previous_champion", "latest"):
        table.add_column(column)
    columns = sorted(temperatures)
    for temperature in columns:
        table.add_column(f"latest at T={temperature}")
    for cells, verdicts in rows:
        table.add_row(*cells, *(temperature_verdict(verdicts[t]) if t in verdicts else "-" for t in columns))
    print_data(table)


def show_model(registry: Registry, name: str, version: str | None) -> None:
    if version is not None:
        model_version = registry.version(name, version)
        table = Table(title=f"{name} v{version} aliases: {_aliases_of(registry, name, version)}",
                      title_justify="left", show_header=False)
        table.add_column("tag", style="bold")
        table.add_column("value")
        for key, value in sorted(model_version.tags.items()):
            if key != TAG_GATE_DECISION:
                table.add_row(key, value)
        print_data(table)
        if TAG_GATE_DECISION in model_version.tags:
            decision = json.loads(model_version.tags[TAG_GATE_DECISION])
            print_data(comparisons_table("gate comparisons", decision["comparisons"]))
        return
    versions = registry.versions(name)
    if not versions:
        raise DraftlineError(f"no registered model '{name}'; see `draftline registry list`")
    table = Table(title=name, title_justify="left")
    for column in ("version", "aliases", "gate", "source", "verdict by temperature", "metrics", "reasons"):
        table.add_column(column)
    for model_version in versions:
        metrics = metrics_from_tags(model_version.tags)
        shown = ", ".join(f"{key}={value:.3g}" for key, value in sorted(metrics.items())
                          if key.endswith(("/tau", "/speedup")))
        verdicts = "; ".join(f"T={temperature} {temperature_verdict(by_domain)}"
                             for temperature, by_domain in verdicts_from_tags(model_version.tags).items())
        table.add_row(str(model_version.version), _aliases_of(registry, name, model_version.version),
                      model_version.tags.get(TAG_GATE, "-"), model_version.tags.get("draftline.source", "-"),
                      verdicts or "-", shown, model_version.tags.get(TAG_GATE_REASONS, ""))
    print_data(table)


def promote_version(registry: Registry, params: PromoteParams, name: str, version: str, force: bool,
                    reason: str | None, adopt: bool = False) -> None:
    registry.check_owned(name, adopt)
    recorded = registry.version(name, version).tags  # fails with a clear message when it does not exist
    champion = registry.alias_version(name, CHAMPION)
    if champion is not None and str(champion.version) == str(version):
        console.print(f"{name} v{version} is already the champion; nothing to do")
        return
    if not force and TAG_GATE in recorded:  # a recorded decision is history: only --force overrides it
        console.print(f"{name} v{version}: gate already decided '{recorded[TAG_GATE]}' "
                      f"({recorded.get(TAG_GATE_REASONS, '')}); left as recorded. To override it: "
                      "--force --reason TEXT", highlight=False)
        return
    if not force:
        decision = gate_version(registry, params, name, version)
        verdict = {"promoted": "promoted to champion", "rejected": "rejected: " + "; ".join(decision.reasons),
                   "undecided": "undecided: " + "; ".join(decision.undecided)}[decision.outcome]
        console.print(f"{name} v{version}: gate {verdict}")
        return
    if not reason or not reason.strip():
        raise DraftlineError("--force needs --reason TEXT (recorded on the version); say why the gate is overridden")
    previous = registry.set_champion(name, version)
    registry.tag_version(name, version, {
        TAG_GATE: "forced",
        TAG_FORCED_REASON: reason.strip(),
        TAG_FORCED_BY: getpass.getuser(),
        TAG_FORCED_AT: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    })
    moved = f" (previous_champion: v{previous})" if previous else ""
    console.print(f"{name} v{version}: forced to champion{moved}; reason recorded: {reason.strip()}")


def _run(params: PromoteParams, args: argparse.Namespace) -> None:
    uri = tracking_uri(params.tracking)
    # Reading needs no lock; promoting by hand moves aliases like `promote` does.
    with mlflow_errors(uri), (registry_lock(uri) if args.action == "promote" else contextlib.nullcontext()):
        registry = Registry(uri)
        version = version_number(args.version) if getattr(args, "version", None) is not None else None
        if args.action == "list":
            list_models(registry, params)
        elif args.action == "show":
            show_model(registry, resolve_model(params, args.model), version)
        else:
            promote_version(registry, params, resolve_model(params, args.model), version, args.force,
                            args.reason, args.adopt_foreign_model)


def main(argv: Sequence[str] | None = None) -> int:
    parser = stage_parser("draftline registry", "Inspect the MLflow drafter registry and promote by hand.")
    # `--params` is also accepted after the action (SUPPRESS keeps the top-level default otherwise).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--params", default=argparse.SUPPRESS, help="path to params.yaml")
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", parents=[common], help="registered drafters with their champion / previous_champion")
    show = actions.add_parser("show", parents=[common], help="versions of one model, or every tag of one version")
    show.add_argument("model", help=f"registered model name, or a drafter kind ({'|'.join(DRAFTER_NAMES)})")
    show.add_argument("version", nargs="?", help="version number (default: all versions)")
    promote = actions.add_parser("promote", parents=[common], help="run the gate on a version, or --force it to champion")
    promote.add_argument("model", help=f"registered model name, or a drafter kind ({'|'.join(DRAFTER_NAMES)})")
    promote.add_argument("version", help="version number")
    promote.add_argument("--force", action="store_true", help="skip the gate (needs --reason)")
    promote.add_argument("--reason", help="why the gate is overridden (recorded as a version tag)")
    promote.add_argument(ADOPT_FLAG, action="store_true",
                         help="promote in a registered model draftline did not create (tags it as draftline's)")
    return run_stage(parser, PromoteParams, _run, argv)


if __name__ == "__main__":
    sys.exit(main())
