"""matplotlib figures of runs and comparisons (Agg backend: files, never windows)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

COLOURS: list[tuple[float, float, float]] = [tuple(c[:3]) for c in plt.get_cmap("tab10")(np.arange(10))]
DPI = 130


def colour_of(strategies: Sequence[str]) -> dict[str, tuple[float, float, float]]:
    return {s: COLOURS[i % len(COLOURS)] for i, s in enumerate(strategies)}


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def trajectory(curves: Mapping[str, pd.DataFrame], *, xlabel: str, target: float | None = None,
               best: float | None = None, title: str = "", points: pd.DataFrame | None = None) -> Figure:
    """Best-so-far vs budget, one panel per strategy: median over seeds (thick), bootstrap
    band of the median, each seed faintly, and the other strategies' medians in grey.

    ``curves[strategy]`` has columns x, median, low, high and one column per seed
    named ``seed<N>``. A single run passes one curve and, as ``points`` (columns x,
    fitness), every evaluation, drawn as dots.
    """
    names = list(curves)
    single = points is not None
    colours = colour_of(names)
    ncols = 1 if len(names) == 1 else 2
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols if ncols > 1 else 8, 3.4 * nrows + 0.8),
                             sharex=True, sharey=True, squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        c, col = curves[name], colours[name]
        for other in names:
            if other != name:
                ax.step(curves[other]["x"], curves[other]["median"], where="post", color="0.6", lw=1)
        for seed_col in [k for k in c.columns if k.startswith("seed")]:
            ax.step(c["x"], c[seed_col], where="post", color=col, alpha=0.25, lw=0.8)
        ax.fill_between(c["x"], c["low"], c["high"], step="post", color=col, alpha=0.25, lw=0)
        if points is not None:
            ax.scatter(points["x"], points["fitness"], s=12, color="0.35", zorder=3, label="each evaluation (passed)")
        ax.step(c["x"], c["median"], where="post", color=col, lw=2.2,
                label="best so far" if single else f"{name}: median")
        if best is not None:
            ax.axhline(best, color="black", ls=":", lw=1, label=f"best in landscape {best:.3g}")
        if target is not None:
            ax.axhline(target, color="black", ls="--", lw=1, label=f"target {target:.3g}")
        ax.set_title(name, loc="left", fontsize=10, color=col, fontweight="bold")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel)
    for ax in axes[:, 0]:
        ax.set_ylabel("best fitness so far")
    if points is not None and len(points):
        low, high = float(points["fitness"].min()), float(points["fitness"].max())
        pad = 0.05 * (high - low) if high > low else 0.05 * high
        axes[0, 0].set_ylim(max(0.0, low - pad), high + pad)
        axes[0, 0].set_ylabel("fitness")
    else:
        _zoom_to_top(axes[0, 0], curves, target)
    sub = "" if single else "thin: each seed; band: bootstrap interval of the median; grey: the other strategies' medians"
    fig.suptitle("\n".join(t for t in (title, sub) if t), fontsize=10)
    fig.tight_layout()
    return fig


def _zoom_to_top(ax: Axes, curves: Mapping[str, pd.DataFrame], target: float | None) -> None:
    """Start the y axis just below where the medians start, so the approach to the top shows."""
    starts = [float(c["low"].iloc[min(len(c) - 1, 1)]) for c in curves.values() if len(c)]
    top = max([float(c["high"].max()) for c in curves.values() if len(c)] + [target or 0.0])
    if starts and top > 0:
        bottom = max(0.0, min(starts))
        pad = 0.06 * (top - bottom) if top > bottom else 0.05 * top
        ax.set_ylim(max(0.0, bottom - pad), top + pad)


def to_target(frame: pd.DataFrame, summary: pd.DataFrame, *, budget: float, unit_label: str,
              target: float) -> Figure:
    """Left: cost to reach the target per seed (hollow = not reached), median and interval.
    Right: share of runs that reached the target within each budget."""
    strategies = list(dict.fromkeys(frame["strategy"]))
    colours = colour_of(strategies)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [1.1, 1]})
    rng = np.random.default_rng(0)  # jitter only; fixed so the picture reruns identically
    for i, name in enumerate(strategies):
        rows = frame[frame["strategy"] == name]
        x = i + rng.uniform(-0.15, 0.15, len(rows))
        reached = rows["reached"].to_numpy(bool)
        col = colours[name]
        left.scatter(x[reached], rows["cost"][reached], color=col, s=22, zorder=3)
        left.scatter(x[~reached], rows["cost"][~reached], facecolors="none", edgecolors=col, s=22, zorder=3)
        s = summary[summary["strategy"] == name].iloc[0]
        left.errorbar([i + 0.32], [s["median"]], yerr=[[s["median"] - s["low"]], [s["high"] - s["median"]]],
                      fmt="D", color="black", ms=5, capsize=4, zorder=4)
    left.axhspan(budget, budget * 1.08 + 1, color="0.9", zorder=0)
    left.text(len(strategies) - 0.5, budget + 0.5, "not reached", ha="right", va="bottom", fontsize=8, color="0.4")
    left.set_xticks(range(len(strategies)), strategies)
    left.set_xlim(-0.5, len(strategies) - 0.4)
    left.set_ylim(0, budget * 1.08 + 1)
    left.set_ylabel(f"{unit_label} to reach {target:.3g}")
    left.set_title("per seed (hollow: not reached); ◆ median, 95% interval", fontsize=10)
    left.grid(axis="y", alpha=0.3)
    grid = np.linspace(0, budget, 200)
    for name in strategies:
        costs = frame.loc[(frame["strategy"] == name) & frame["reached"], "cost"].to_numpy(float)
        n = int((frame["strategy"] == name).sum())
        share = [(costs <= g).sum() / n for g in grid]
        right.step(grid, share, where="post", color=colours[name], lw=2, label=name)
    right.set_xlabel(unit_label)
    right.set_ylabel("share of seeds that reached the target")
    right.set_ylim(-0.02, 1.02)
    right.set_title("runs at target within a budget", fontsize=10)
    right.grid(alpha=0.3)
    right.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    return fig


def operators(table: pd.DataFrame) -> Figure:
    """Per (strategy, operator): share of children that passed and that beat their parent."""
    labels = [f"{s} / {o}  (n={n})" for s, o, n in zip(table["strategy"], table["operator"], table["children"],
                                                       strict=True)]
    y = np.arange(len(table))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(table) + 1.4))
    ax.barh(y - 0.2, table["passed_rate"], height=0.38, color="#4c72b0", label="passed")
    ax.barh(y + 0.2, table["improved_rate"].fillna(0), height=0.38, color="#dd8452", label="improved on parent")
    for yi, (p, imp) in enumerate(zip(table["passed_rate"], table["improved_rate"], strict=True)):
        ax.text(p + 0.01, yi - 0.2, f"{p:.0%}", va="center", fontsize=8)
        ax.text((0 if np.isnan(imp) else imp) + 0.01, yi + 0.2, "-" if np.isnan(imp) else f"{imp:.0%}",
                va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.12)
    ax.set_xlabel("share of the operator's children (all seeds pooled)")
    ax.set_title("operator success", pad=24)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=9, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return fig


def lineage(chains: Mapping[str, pd.DataFrame]) -> Figure:
    """Fitness along the chain from a seed to the best candidate, one panel per run shown.

    Only a candidate that passed has a fitness and a point on the line; one that did
    not (a SKIPPED seed, a failed parent) is an open mark on the axis labelled with its
    status, never a point at fitness 0.
    """
    n = max(1, len(chains))
    fig, axes = plt.subplots(n, 1, figsize=(9, 3.0 * n), squeeze=False)
    ops = sorted({op for c in chains.values() for op in c["operator"]})
    marks = {op: "os^Dv<>P*X"[i % 10] for i, op in enumerate(ops)}
    colours = colour_of(list(chains))
    for ax, (name, chain) in zip(axes[:, 0], chains.items(), strict=False):
        fit = chain["fitness"].astype(float)
        has = fit.notna()
        top = float(fit.max()) if has.any() else 1.0
        floor = 0.0
        ax.plot(chain["step"][has], fit[has], color=colours[name], lw=1.5)
        for op in [o for o in ops if (chain["operator"] == o).any()]:
            sel = (chain["operator"] == op) & has
            ax.scatter(chain["step"][sel], fit[sel], marker=marks[op], s=40, color=colours[name],
                       edgecolors="black", linewidths=0.5, zorder=3, label=op)
        on_axis = ax.get_xaxis_transform()  # x in data, y as a share of the panel: not a fitness
        for step, status in zip(chain["step"][~has], chain["status"][~has], strict=True):
            ax.scatter([step], [0.04], marker="x", s=40, color="0.4", zorder=3, transform=on_axis)
            ax.annotate(f"{status}: no fitness", (step, 0.04), xycoords=on_axis, textcoords="offset points",
                        xytext=(5, 4), fontsize=7, color="0.4")
        y_of = fit.where(has, floor)
        for step, f, changed in zip(chain["step"], y_of, chain["changed"], strict=True):
            if changed:  # one parameter per line, alternately below and above the point
                text = "\n".join(changed.split(", ")[:4]) + ("\n..." if changed.count(", ") >= 4 else "")
                below = int(step) % 2 == 1
                ax.annotate(text, (step, f), textcoords="offset points", xytext=(5, -6 if below else 6),
                            va="top" if below else "bottom", fontsize=7, color="0.25")
        ax.set_title(name, fontsize=10, loc="left")
        ax.set_ylabel("fitness (geomean speedup)")
        ax.set_xticks(list(chain["step"]))
        ax.grid(alpha=0.3)
        ax.set_ylim(floor, top * 1.3 + 1e-9)
        if has.any():
            ax.legend(loc="lower right", fontsize=7, ncol=len(ops))
    width = max([len(c) for c in chains.values()] + [2])
    for ax in axes[:, 0]:
        ax.set_xlim(-0.3, width - 0.2)
    axes[-1, 0].set_xlabel("step from the seed (labels: parameters changed)")
    fig.suptitle("lineage of the best candidate", y=1.0)
    fig.tight_layout()
    return fig
