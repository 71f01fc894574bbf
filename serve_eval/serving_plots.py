"""Stage `serve_check` plot: vLLM-measured τ against draftline's τ on the same prompts (CSV + PNG), one
point per drafter, domain and run (greedy single-request, greedy batched, each T > 0)."""

from __future__ import annotations

from pathlib import Path

from pipeline.atomic import save_figure_atomic, write_text_atomic
from serve_eval.plots import csv_text

SERVING_CSV = "serving_tau.csv"
SERVING_PNG = "serving_tau.png"


def serving_rows(report: dict) -> list[list[object]]:
    """[drafter, domain, run, draftline_tau, vllm_tau] for every run where both sides measured τ."""
    rows = []
    for kind, entry in report["drafters"].items():
        for domain, record in entry["domains"].items():
            if "draftline" not in record:
                continue
            runs = [(name, record[name]["vllm"]["tau"], record["draftline"]["tau"]) for name in ("single", "batched")]
            runs += [(name, run["vllm"]["tau"], run["draftline"]["tau"]) for name, run in record["sampled"].items()]
            rows += [[kind, domain, name, round(ours, 6), round(theirs, 6)]
                     for name, theirs, ours in runs if theirs is not None]
    return rows


def write_serving_plots(directory: Path, report: dict) -> None:
    """Always writes both files (DVC declares them), empty of points when nothing ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    rows = serving_rows(report)
    write_text_atomic(directory / SERVING_CSV, csv_text(["drafter", "domain", "run", "draftline_tau", "vllm_tau"], rows))
    gap = float(report["max_tau_gap"])
    top = max([1.0] + [max(row[3], row[4]) for row in rows]) * 1.1
    figure, axis = plt.subplots(figsize=(5, 5))
    line = [1.0, top]
    axis.plot(line, line, color="grey", linewidth=1, label="equal")
    axis.fill_between(line, [x * (1 - gap) for x in line], [x * (1 + gap) for x in line], color="grey", alpha=0.15,
                      label=f"±{gap:.0%} (serve_check.max_tau_gap)")
    markers = {"single": "o", "batched": "s"}  # sampled runs: triangles
    for kind, domain, run, ours, theirs in rows:
        axis.scatter([ours], [theirs], marker=markers.get(run, "^"), label=f"{kind} {domain} {run}", zorder=3)
    axis.set(xlabel="draftline tau (same prompts)", ylabel="vLLM tau (its spec-decode counters)",
             xlim=(1.0, top), ylim=(1.0, top), title="tau: vLLM vs draftline (bonus included)")
    axis.legend(fontsize=7)
    save_figure_atomic(figure, directory / SERVING_PNG)
    plt.close(figure)
