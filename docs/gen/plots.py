"""Draws the plots of docs/results.md from the recorded figures in docs/gen/results.json (nothing
is measured here: the benchmarks in benchmarks/ measure; this draws what they printed). Each plot
names the date and the command of its measurement.

    python docs/gen/plots.py        # writes docs/img/*.png (needs matplotlib)
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("results.json")
OUT = ROOT / "docs" / "img"


def _size_label(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def _time_label(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:g} {unit}"
    return f"{seconds * 1e9:g} ns"


def _footer(fig, *records) -> None:
    lines = [f"measured {r['date']}: {r['command']}" for r in records]
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, va="bottom", ha="left", wrap=True)


def _log_axes(ax, sizes, times) -> None:
    import matplotlib.ticker as ticker

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _size_label(v)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _time_label(v)))
    ax.grid(True, which="major", alpha=0.3)
    ax.set_xlabel("message size per rank")
    ax.set_ylabel("time per allreduce (median)")


def allreduce(data, plt):
    main, others = data["allreduce"], data["allreduce_others"]
    fig, ax = plt.subplots(figsize=(8, 5.6))
    for label, times in main["series"].items():
        ax.plot(main["sizes"], times, marker="o", label=label)
    for (label, times), marker in zip(others["series"].items(), ("s", "^", "D")):
        # Three sizes only: markers, no line, so nothing between them is implied.
        ax.plot(
            others["sizes"],
            times,
            marker=marker,
            markersize=8,
            linestyle="none",
            label=label + " (separate runs)",
        )
    _log_axes(ax, main["sizes"], None)
    ax.set_title(f"allreduce, 2 ranks, float32, one machine ({main['date']})")
    ax.legend(fontsize=8)
    fig.subplots_adjust(bottom=0.2)
    _footer(fig, main, others)
    return fig


def many_small(data, plt):
    rec = data["many_small"]
    fig, ax = plt.subplots(figsize=(9, 4.6))
    labels = [row[0] for row in rec["rows"]]
    low = [row[1] for row in rec["rows"]]
    high = [row[2] for row in rec["rows"]]
    y = range(len(labels))
    ax.barh(y, high, color="#c9d8ef", label="slowest recorded")
    ax.barh(y, low, color="#4c72b0", label="fastest recorded")
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    import matplotlib.ticker as ticker

    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: _time_label(v)))
    ax.set_xlabel("time for all 200 (median)")
    ax.set_title(f"{rec['what']} ({rec['date']})")
    ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.36, bottom=0.22)
    _footer(fig, rec)
    return fig


def _grouped_bars(ax, groups, series, unit_scale, unit):
    import numpy as np

    x = np.arange(len(groups))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        shown = [v / unit_scale if v is not None else 0 for v in values]
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, shown, width, label=label)
        for bar, v in zip(bars, values):
            ax.annotate(
                "n/a" if v is None else f"{v / unit_scale:.3g}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(x)
    ax.set_xticklabels([g.replace(", ", "\n") for g in groups], fontsize=8)
    ax.set_ylabel(unit)
    tallest = max(v for values in series.values() for v in values if v is not None)
    ax.set_ylim(0, tallest / unit_scale * 1.35)
    ax.legend(fontsize=8, loc="upper left")


def steps(data, plt):
    torch_rec, tf_rec = data["torch_step"], data["tf_step"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.8))
    _grouped_bars(left, torch_rec["models"], torch_rec["series"], 1e-3, "ms per step (median)")
    left.set_title(f"PyTorch step, 2 ranks ({torch_rec['date']})", fontsize=10)
    _grouped_bars(right, tf_rec["models"], tf_rec["series"], 1e-3, "ms per step (median)")
    right.set_title(f"TensorFlow step, 2 ranks ({tf_rec['date']})", fontsize=10)
    fig.subplots_adjust(bottom=0.22)
    _footer(fig, torch_rec, tf_rec)
    return fig


def multihost(data, plt):
    rec = data["multihost"]
    fig, ax = plt.subplots(figsize=(8, 5.4))
    for label, times in rec["series"].items():
        ax.plot(
            rec["sizes"],
            times,
            marker="o",
            linestyle="-" if "scaleout" in label else "--",
            label=label,
        )
    _log_axes(ax, rec["sizes"], None)
    ax.set_title(f"allreduce across 2 hosts x 2 ranks, float32 ({rec['date']})")
    ax.legend(fontsize=8)
    fig.subplots_adjust(bottom=0.2)
    _footer(fig, rec)
    return fig


def dlrm(data, plt):
    rec = data["dlrm"]
    fig, ax = plt.subplots(figsize=(7, 4.6))
    _grouped_bars(ax, rec["ranks"], rec["series"], 1e3, "thousand samples/s (higher is better)")
    ax.set_xlabel("ranks")
    ax.set_title(f"DLRM training throughput ({rec['date']})")
    fig.subplots_adjust(bottom=0.2)
    _footer(fig, rec)
    return fig


# (file name under docs/img, what draws it): docs/results.md shows each of these.
FIGURES = (
    ("allreduce_sizes.png", allreduce),
    ("allreduce_200x16k.png", many_small),
    ("step_times.png", steps),
    ("multihost_allreduce.png", multihost),
    ("dlrm_throughput.png", dlrm),
)


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Fixed metadata so that drawing again from the same figures gives the same files.
    data = json.loads(DATA.read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    for name, draw in FIGURES:
        fig = draw(data, plt)
        fig.savefig(OUT / name, dpi=110, metadata={"Software": None})
        plt.close(fig)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
