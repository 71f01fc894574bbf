"""Stage `serve_check` plot: vLLM-measured τ against draftline's τ on the same prompts (CSV + PNG)."""

from __future__ import annotations

from pathlib import Path

from pipeline.atomic import save_figure_atomic, write_text_atomic
from serve_eval.plots import csv_text

SERVING_CSV = "serving_tau.csv"
SERVING_PNG = "serving_tau.png"


def serving_rows(report: dict) -> list[list[object]]:
    """[drafter, domain, draftline_tau, vllm_tau] for every cell where both sides measured τ."""
    rows = []
    for kind, entry in report["drafters"].items():
        for domain, record in entry["domains"].items():
            if record["vllm"]["tau"] is not None and "draftline" in record:
                rows.append([kind, domain, round(record["draftline"]["tau"], 6), round(record["vllm"]["tau"], 6)])
    return rows


def write_serving_plots(directory: Path, report: dict) -> None:
    """Always writes both files (DVC declares them), empty of points when nothing ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    rows = serving_rows(report)
    write_text_atomic(directory / SERVING_CSV, csv_text(["drafter", "domain", "draftline_tau", "vllm_tau"], rows))
    gap = float(report["max_tau_gap"])
    top = max([1.0] + [max(row[2], row[3]) for row in rows]) * 1.1
    figure, axis = plt.subplots(figsize=(5, 5))
    line = [1.0, top]
    axis.plot(line, line, color="grey", linewidth=1, label="equal")
    axis.fill_between(line, [x * (1 - gap) for x in line], [x * (1 + gap) for x in line], color="grey", alpha=0.15,
                      label=f"±{gap:.0%} (serve_check.max_tau_gap)")
    for kind, domain, ours, theirs in rows:
        axis.scatter([ours], [theirs], label=f"{kind} {domain}", zorder=3)
    axis.set(xlabel="draftline tau (same prompts)", ylabel="vLLM tau (its spec-decode counters)",
             xlim=(1.0, top), ylim=(1.0, top), title="tau: vLLM vs draftline (bonus included)")
    axis.legend(fontsize=7)
    save_figure_atomic(figure, directory / SERVING_PNG)
    plt.close(figure)
