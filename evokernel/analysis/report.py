"""``python -m evokernel.analysis.report DIR``: tables, plots and summary.md for a comparison or a run.

For a comparison folder (``comparison.json``): best-so-far trajectories with
bootstrap bands, the cost to reach a target (default 95% of the landscape's best
fitness, else of the best seen in any run) with runs that never reached it kept
and counted, rank tests between strategies (Holm-corrected), the seeds a test
would need, operator success rates, and the lineage of each strategy's best
candidate. For a single run directory (``run.json``): what applies to one run
(trajectory, operators, lineage). Everything lands in ``DIR/report/`` unless
``--out``; the numbers are seeded, so a rerun writes the same files.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evokernel.analysis import stats, tables
from evokernel.cli import configure_logging
from evokernel.journal import RunDir, RunDirError

EXIT_USAGE = 2


class ReportError(ValueError):
    """A folder that is neither a comparison nor a run; one line, exit status 2."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evokernel.analysis.report", description=__doc__.splitlines()[0])
    p.add_argument("path", metavar="RUN_OR_COMPARISON_DIR")
    p.add_argument("--out", metavar="DIR", help="where tables and plots go (default DIR/report)")
    p.add_argument("--target", type=float, help="absolute target fitness (overrides --target-fraction)")
    p.add_argument("--target-fraction", type=float, help="share of the best fitness (default: as compared, 0.95)")
    p.add_argument("--resamples", type=int, default=stats.RESAMPLES, help="bootstrap resamples")
    p.add_argument("--level", type=float, default=stats.LEVEL, help="interval level (default 0.95)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging("evokernel.report")
    try:
        folder = build_report(args.path, out=args.out, target=args.target, target_fraction=args.target_fraction,
                              resamples=args.resamples, level=args.level)
    except (ReportError, RunDirError) as exc:
        print(f"evokernel.report: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print((folder / "summary.md").read_text())
    print(f"report: {folder}", file=sys.stderr)
    return 0


def build_report(path: str | Path, *, out: str | Path | None = None, target: float | None = None,
                 target_fraction: float | None = None, resamples: int = stats.RESAMPLES,
                 level: float = stats.LEVEL) -> Path:
    root = Path(path)
    if resamples < 100:
        raise ReportError(f"--resamples {resamples}: use at least 100")
    if not 0 < level < 1:
        raise ReportError(f"--level {level}: must be in (0, 1)")
    if target_fraction is not None and not 0 < target_fraction <= 1:
        raise ReportError(f"--target-fraction {target_fraction}: must be in (0, 1]")
    folder = Path(out) if out else root / "report"
    if (root / "comparison.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        _comparison(root, folder, target, target_fraction, resamples, level)
    elif (root / "run.json").is_file():
        run = RunDir.open(root)
        folder.mkdir(parents=True, exist_ok=True)
        _single(run, folder)
    else:
        raise ReportError(f"{root} is neither a comparison folder (comparison.json) nor a run directory (run.json)")
    return folder


# -- comparison ------------------------------------------------------------------------------

def _comparison(root: Path, folder: Path, target: float | None, fraction: float | None, resamples: int,
                level: float) -> None:
    from evokernel.analysis import plots

    manifest = json.loads((root / "comparison.json").read_text())
    if "outcomes" not in manifest:
        raise ReportError(f"{root}: the comparison has not finished (no outcomes in comparison.json)")
    parquet = root / "evaluations.parquet"
    if parquet.is_file():
        frame = pd.read_parquet(parquet)
    else:
        frame = tables.stack([tables.evaluations(RunDir.open(root / r["dir"]), r["strategy"], r["seed"])
                              for r in manifest["runs"]])
    strategies = list(manifest["strategies"])
    unit = manifest["budget"]["unit"]
    budget = float(manifest["budget"]["value"])
    unit_label = "evaluations" if unit == "evaluations" else "device seconds"
    fraction = fraction if fraction is not None else float(manifest.get("target_fraction", 0.95))
    landscape = manifest.get("landscape") or {}
    reference = landscape.get("best_fitness")
    reference_what = "the best fitness in the landscape"
    if reference is None:
        reference = float(frame["best_so_far"].max()) if len(frame) else 0.0
        reference_what = "the best fitness seen in any run"
    if target is None:
        target = fraction * reference
        target_what = f"{fraction:.0%} of {reference_what} ({reference:.4g})"
    else:
        target_what = "given on the command line"
    boot = {"resamples": resamples, "level": level}

    reach = tables.to_target(frame, target, budget, unit)
    costs = {s: reach.loc[reach["strategy"] == s, "cost"].to_list() for s in strategies}
    finals = {s: reach.loc[reach["strategy"] == s, "final_best"].to_list() for s in strategies}
    summary = _per_strategy(reach, strategies, boot)
    pair_cost = stats.pairwise(costs, lower_is_better=True)
    pair_final = stats.pairwise(finals, lower_is_better=False)
    ops = tables.operator_success(frame)
    chains = _best_chains(root, manifest, reach, strategies)
    curves = _curves(frame, strategies, unit, budget, boot)

    reach.to_csv(folder / "to_target.csv", index=False)
    summary.to_csv(folder / "strategies.csv", index=False)
    pair_cost.to_csv(folder / "pairwise_to_target.csv", index=False)
    pair_final.to_csv(folder / "pairwise_final_best.csv", index=False)
    ops.to_csv(folder / "operators.csv", index=False)
    pd.concat([c.assign(strategy=s) for s, c in chains.items()], ignore_index=True).to_csv(
        folder / "lineage.csv", index=False)
    pd.concat([c.assign(strategy=s) for s, c in curves.items()], ignore_index=True).to_csv(
        folder / "trajectory.csv", index=False)

    n_seeds = len(manifest["seeds"])
    title = (f"{manifest['workload']}: {len(strategies)} strategies x {n_seeds} seeds, "
             f"budget {budget:g} {unit_label}")
    plots.save(plots.trajectory(curves, xlabel=f"{unit_label} spent (seeds included)", target=target,
                                best=landscape.get("best_fitness"), title=title), folder / "trajectory.png")
    cost_summary = summary.rename(columns={"cost_median": "median", "cost_low": "low", "cost_high": "high"})
    plots.save(plots.to_target(reach, cost_summary, budget=budget, unit_label=unit_label, target=target),
               folder / "to_target.png")
    plots.save(plots.operators(ops), folder / "operators.png")
    plots.save(plots.lineage(chains), folder / "lineage.png")

    text = _comparison_md(manifest, summary, pair_cost, pair_final, ops, chains, target, target_what,
                          budget, unit_label, boot)
    (folder / "summary.md").write_text(text)


def _per_strategy(reach: pd.DataFrame, strategies: list[str], boot: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for s in strategies:
        r = reach[reach["strategy"] == s]
        cost = stats.bootstrap_median(r["cost"].to_numpy(float), **boot)
        final = stats.bootstrap_median(r["final_best"].to_numpy(float), **boot)
        rows.append({"strategy": s, "seeds": len(r), "reached": int(r["reached"].sum()),
                     "cost_median": cost.median, "cost_low": cost.low, "cost_high": cost.high,
                     "cost_width": cost.width, "final_median": final.median, "final_low": final.low,
                     "final_high": final.high, "final_width": final.width})
    return pd.DataFrame(rows)


def _curves(frame: pd.DataFrame, strategies: list[str], unit: str, budget: float,
            boot: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """Per strategy: best-so-far of every seed on one budget grid, median and band."""
    if unit == "evaluations":
        grid = np.arange(1, int(budget) + 1, dtype=float)
        cost_col = "index"
    else:
        grid = np.linspace(0.0, budget, 201)
        cost_col = "spent_device_s"
    out = {}
    for s in strategies:
        rows = frame[frame["strategy"] == s]
        seeds = sorted(rows["seed"].unique())
        matrix = np.zeros((len(seeds), len(grid)))
        for i, seed in enumerate(seeds):
            run = rows[rows["seed"] == seed]
            cost, best = run[cost_col].to_numpy(float), run["best_so_far"].to_numpy(float)
            at = np.searchsorted(cost, grid, side="right") - 1  # last evaluation within the budget
            matrix[i] = np.where(at >= 0, best[np.clip(at, 0, None)] if len(best) else 0.0, 0.0)
        med, low, high = stats.bootstrap_median_curve(matrix, **boot) if len(seeds) else (grid * np.nan,) * 3
        curve = pd.DataFrame({"x": grid, "median": med, "low": low, "high": high})
        for i, seed in enumerate(seeds):
            curve[f"seed{seed}"] = matrix[i]
        out[s] = curve
    return out


def _best_chains(root: Path, manifest: dict[str, Any], reach: pd.DataFrame,
                 strategies: list[str]) -> dict[str, pd.DataFrame]:
    """Per strategy, the lineage in its best run (highest final best; ties: lowest seed)."""
    dirs = {(r["strategy"], r["seed"]): r["dir"] for r in manifest["runs"]}
    out = {}
    for s in strategies:
        r = reach[reach["strategy"] == s].sort_values(["final_best", "seed"], ascending=[False, True])
        if r.empty:
            continue
        seed = int(r["seed"].iloc[0])
        out[f"{s} (seed {seed})"] = tables.lineage(RunDir.open(root / dirs[(s, seed)]))
    return out


# -- single run ------------------------------------------------------------------------------

def _single(run: RunDir, folder: Path) -> None:
    from evokernel.analysis import plots

    frame = tables.evaluations(run)
    strategy = str(run.manifest.get("strategy", "run"))
    ops = tables.operator_success(frame)
    chain = tables.lineage(run)
    frame.to_csv(folder / "evaluations.csv", index=False)
    ops.to_csv(folder / "operators.csv", index=False)
    chain.to_csv(folder / "lineage.csv", index=False)
    n = len(frame)
    best = frame["best_so_far"].to_numpy(float)
    curve = pd.DataFrame({"x": np.arange(1, n + 1, dtype=float), "median": best, "low": best, "high": best})
    points = pd.DataFrame({"x": frame["index"].astype(float), "fitness": frame["fitness"]}).dropna()
    plots.save(plots.trajectory({strategy: curve}, xlabel="evaluations spent (seeds included)",
                                title=f"{run.root.name}: best fitness so far", points=points),
               folder / "trajectory.png")
    if len(ops):
        plots.save(plots.operators(ops), folder / "operators.png")
    plots.save(plots.lineage({strategy: chain}), folder / "lineage.png")
    final = float(best[-1]) if n else 0.0
    lines = [f"# Run {run.root.name}", "",
             f"Workload {run.manifest.get('workload', '?')}, strategy {strategy}, seed {run.manifest.get('seed', '?')}: "
             f"{n} evaluations, best fitness {final:.4g}.", "",
             "![trajectory](trajectory.png)", "", "## Operators", "", _md(_ops_view(ops)), "",
             "![operators](operators.png)" if len(ops) else "", "", "## Lineage of the best candidate", "",
             _md(_chain_view(chain)), "", "![lineage](lineage.png)", ""]
    (folder / "summary.md").write_text("\n".join(lines))


# -- markdown --------------------------------------------------------------------------------

def _md(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "(none)"
    head = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4g}"
    return str(v).replace("|", "\\|")


def _cost(v: float, budget: float) -> str:
    return f">{budget:g} (not reached)" if v > budget else f"{v:.4g}"


def _interval(low: float, high: float, budget: float) -> str:
    hi = f">{budget:g}" if high > budget else f"{high:.4g}"
    lo = f">{budget:g}" if low > budget else f"{low:.4g}"
    return f"[{lo}, {hi}]"


def _ops_view(ops: pd.DataFrame) -> pd.DataFrame:
    view = ops[["strategy", "operator", "children", "passed", "passed_rate", "improved", "judged", "improved_rate"]]
    return view.assign(passed_rate=[f"{x:.0%}" for x in view["passed_rate"]],
                       improved_rate=["-" if np.isnan(x) else f"{x:.0%}" for x in view["improved_rate"]])


def _chain_view(chain: pd.DataFrame) -> pd.DataFrame:
    return chain[["step", "candidate", "operator", "generation", "status", "fitness", "changed"]]


def _comparison_md(manifest: dict[str, Any], summary: pd.DataFrame, pair_cost: pd.DataFrame,
                   pair_final: pd.DataFrame, ops: pd.DataFrame, chains: dict[str, pd.DataFrame],
                   target: float, target_what: str, budget: float, unit_label: str, boot: dict[str, Any]) -> str:
    n_seeds = len(manifest["seeds"])
    level = f"{boot['level']:.0%}"
    ls = manifest.get("landscape")
    lines = [f"# Strategy comparison: {manifest['workload']}", "",
             f"{len(manifest['strategies'])} strategies x {n_seeds} seeds ({', '.join(map(str, manifest['seeds']))}), "
             f"budget {budget:g} {unit_label} per run (seeds included), batch {manifest.get('batch_size')}, "
             f"shapes: {', '.join(manifest.get('shapes', []))}.", ""]
    if ls:
        lines += [f"Evaluator: replay of `{ls['path']}` ({ls['records']} records, {ls['passed']} passed, "
                  f"valid points of the restricted space: {ls['grid_points']}, best fitness {ls['best_fitness']:.4g}, "
                  f"sha256 {ls['sha256'][:12]}). Candidates proposed that the landscape lacks (SKIPPED, "
                  f"never invented): **{manifest.get('unseen', 0)}**.", ""]
    else:
        lines += ["Evaluator: live (no landscape).", ""]
    lines += [f"Target fitness: **{target:.4g}** = {target_what}.", "",
              f"## {unit_label.capitalize()} to reach the target", "",
              f"Median over seeds with a {level} percentile-bootstrap interval ({boot['resamples']} resamples, "
              f"seeded). A run that never reached the target counts as >{budget:g} (censored, not dropped).", ""]
    view = pd.DataFrame({
        "strategy": summary["strategy"],
        "reached": [f"{r}/{n}" for r, n in zip(summary["reached"], summary["seeds"], strict=True)],
        f"median {unit_label}": [_cost(v, budget) for v in summary["cost_median"]],
        f"{level} interval": [_interval(lo, hi, budget) for lo, hi in zip(summary["cost_low"], summary["cost_high"],
                                                                           strict=True)],
        "median final best": summary["final_median"],
        f"final best {level} interval": [f"[{lo:.4g}, {hi:.4g}]" for lo, hi in
                                          zip(summary["final_low"], summary["final_high"], strict=True)],
    })
    lines += [_md(view), "", "![to target](to_target.png)", "", "![trajectory](trajectory.png)", "",
              "## Rank tests between strategies", "",
              "Two-sided Mann-Whitney U per pair, p-values Holm-corrected over the pairs; `a_better` is the "
              "probability that a run of `a` beats a run of `b` (0.5: no difference); `seeds_needed` is "
              "Noether's estimate of seeds per strategy for 80% power at alpha 0.05 if the observed effect "
              "were the true one (- : no observed effect).", "",
              f"On {unit_label} to target (fewer is better):", "", _md(_pairs_view(pair_cost)), "",
              "On final best fitness (higher is better):", "", _md(_pairs_view(pair_final)), "",
              "## How many seeds", "", _seeds_text(summary, pair_cost, n_seeds, budget, unit_label, level), "",
              "## Operators", "",
              "Share of each operator's children that PASSED, and that beat the best of their parents in the "
              "same run (all seeds pooled; a failed parent counts as fitness 0).", "",
              _md(_ops_view(ops)), "", "![operators](operators.png)", "",
              "## Lineage of each strategy's best candidate", ""]
    for name, chain in chains.items():
        lines += [f"### {name}", "", _md(_chain_view(chain)), ""]
    lines += ["![lineage](lineage.png)", ""]
    return "\n".join(lines)


def _pairs_view(pairs: pd.DataFrame) -> pd.DataFrame:
    return pairs.assign(seeds_needed=["-" if pd.isna(v) else str(int(v)) for v in pairs["seeds_needed"]])


def _seeds_text(summary: pd.DataFrame, pairs: pd.DataFrame, n: int, budget: float, unit: str, level: str) -> str:
    widths = [w for w, hi in zip(summary["cost_width"], summary["cost_high"], strict=True) if hi <= budget]
    parts = []
    if widths:
        w = float(np.median(widths))
        parts.append(f"With {n} seeds the {level} interval of the median {unit} to target is {w:.3g} {unit} wide "
                     f"(median over the strategies whose interval is bounded); halving it would take about "
                     f"{stats.seeds_for_width(w, n, w / 2)} seeds (width ~ 1/sqrt(seeds)).")
    open_ended = [s for s, hi in zip(summary["strategy"], summary["cost_high"], strict=True) if hi > budget]
    if open_ended:
        parts.append(f"The interval of {', '.join(open_ended)} reaches past the budget: too few of its seeds "
                     "reached the target to bound it; a larger budget, not more seeds, is what would help.")
    needed = [int(v) for v in pairs["seeds_needed"] if not pd.isna(v)]
    sig = int(pairs["significant"].sum()) if len(pairs) else 0
    parts.append(f"{sig} of {len(pairs)} pairs differ at alpha 0.05 after Holm's correction.")
    if needed:
        parts.append(f"Detecting the observed effects would take {min(needed)} to {max(needed)} seeds per strategy "
                     f"(median {int(np.median(needed))}); the comparison used {n}.")
    return " ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
