"""Evaluation plots: per-position acceptance and the tau histogram, as CSV (`dvc plots`) and PNG."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pipeline.atomic import save_figure_atomic, write_text_atomic
from serve_eval.cell_sums import CellSums

ACCEPTANCE_CSV = "eval_acceptance.csv"
TAU_CSV = "eval_tau_hist.csv"


def csv_text(header: list[str], rows: list[list[object]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def write_plots(directory: Path, tallies: dict[tuple[str, str, str], CellSums]) -> None:
    """`tallies` is keyed by (drafter, temperature, domain)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    acceptance_rows, tau_rows = [], []
    for (kind, temperature, domain), tally in sorted(tallies.items()):
        series = f"{kind} T={temperature} {domain}"
        for position, (a, d) in enumerate(zip(tally.position_accepted, tally.position_drafted), start=1):
            acceptance_rows.append([series, kind, temperature, domain, position, round(a / d, 6)])
        for committed, count in sorted(tally.committed_per_step.items()):
            tau_rows.append([series, kind, temperature, domain, committed, count])
    write_text_atomic(directory / ACCEPTANCE_CSV,
                      csv_text(["series", "drafter", "temperature", "domain", "position", "acceptance"], acceptance_rows))
    write_text_atomic(directory / TAU_CSV,
                      csv_text(["series", "drafter", "temperature", "domain", "tokens_per_step", "steps"], tau_rows))

    figure, axis = plt.subplots(figsize=(6, 4))
    for series in dict.fromkeys(row[0] for row in acceptance_rows):
        points = [(row[4], row[5]) for row in acceptance_rows if row[0] == series]
        axis.plot(*zip(*points), marker="o", label=series)
    axis.set(xlabel="draft position", ylabel="P(position accepted)", ylim=(0, 1.02),
             title="per-position acceptance")
    axis.legend(fontsize=7)
    save_figure_atomic(figure, directory / "eval_acceptance.png")
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(6, 4))
    series_names = list(dict.fromkeys(row[0] for row in tau_rows))
    width = 0.8 / max(1, len(series_names))
    for offset, series in enumerate(series_names):
        points = [(row[4], row[5]) for row in tau_rows if row[0] == series]
        total = sum(count for _, count in points)
        axis.bar([x + offset * width for x, _ in points], [c / total for _, c in points], width=width, label=series)
    axis.set(xlabel="tokens committed per verifier forward (bonus included)", ylabel="fraction of steps",
             title="tau histogram")
    axis.legend(fontsize=7)
    save_figure_atomic(figure, directory / "eval_tau_hist.png")
    plt.close(figure)
