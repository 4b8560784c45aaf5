"""The drift probe's report: ``docs/drift.md`` from ``results/drift_probe.csv``.

It computes, and only computes, what ``results/drift_probe.py``'s pre-registration fixed: the lr each
rule chose, the cell table over the verdict seeds, the comparisons C1-C5 with 95 % paired t intervals
and their verdicts (``fk.stats``), the drift measures beside the teaching scale's (chapter 04's runs) and
the paper models' (``results/paper_regime_*.csv``), and the pre-registered reading of the verdicts. A
comparison with fewer than two seeds on a side is "untestable here" until its runs finish.

    python results/drift_report.py            # rewrite docs/drift.md from the CSVs
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pandas as pd

import feddr_kit as fk

RESULTS = Path(__file__).resolve().parent
DOC = RESULTS.parent / "docs" / "drift.md"
ACC_MARGIN = 0.005
BUDGET_CORE_HOURS = 14.0  # the probe's CPU budget (its docstring): one torch thread per run, so a run's wall time is its core time


def _probe():
    """The probe script as a module: its design constants are the one source of the plan."""
    spec = importlib.util.spec_from_file_location("drift_probe", RESULTS / "drift_probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


PROBE = _probe()


def cell_label(model: str, epochs: int) -> str:
    return f"{model}, E = {epochs}"


def load(path: Path = RESULTS / "drift_probe.csv") -> pd.DataFrame:
    """The probe's finished runs (one row each; no rows before the first), with every column the report reads."""
    columns = ["model", "local_epochs", "method", "lr", "seed", "role", "status", "final_acc", "late_acc", *PROBE.DRIFT,
               "sec_per_round", "total_seconds"]
    table = fk.sweep.read_results(path) if path.exists() else pd.DataFrame(columns=columns)
    return table.reindex(columns=list(dict.fromkeys([*table.columns, *columns])))


def evaluation(table: pd.DataFrame) -> pd.DataFrame:
    """The finished runs of the verdict seeds."""
    return table[(table["role"] == "evaluation") & (table["status"] == "done")]


def values(table: pd.DataFrame, model: str, epochs: int, method: str, column: str) -> pd.Series:
    """``column`` of one cell and method over the verdict seeds, indexed by seed."""
    rows = evaluation(table)
    rows = rows[(rows["model"] == model) & (rows["local_epochs"] == epochs) & (rows["method"] == method)]
    return rows.set_index("seed")[column].sort_index()


def paired(a: pd.Series, b: pd.Series) -> fk.stats.Interval:
    """The interval of ``a - b`` over the seeds both have (paired t)."""
    seeds = a.dropna().index.intersection(b.dropna().index)
    if seeds.empty:  # neither side has finished a run yet: nothing can be said
        return fk.stats.Interval(float("nan"), -float("inf"), float("inf"), 0, method="paired t")
    return fk.stats.difference(a.loc[seeds].tolist(), b.loc[seeds].tolist(), paired=True)


def gap(table: pd.DataFrame, model: str, epochs: int) -> pd.Series:
    """C1's gap g = FedDr+ − FedAvg in ``late_acc`` per seed."""
    return (values(table, model, epochs, "feddr+", "late_acc")
            - values(table, model, epochs, "fedavg", "late_acc")).dropna()


def claims(table: pd.DataFrame) -> list[fk.stats.Claim]:
    """C1-C5 exactly as pre-registered (seeds 1-3, 95 % paired t, margin 0.5 pp for accuracies, 0 for
    ``weight_change``)."""
    out = []
    acc = {"scale": 100, "unit": " pp", "fmt": ".1f", "margin": ACC_MARGIN}

    def claim(text, setting, diff, **kw):
        out.append(fk.stats.Claim(text, "paper" if text.startswith(("C1", "C2", "C3")) else "chapter hypothesis",
                                  setting, diff, seeds=f"seeds {', '.join(map(str, PROBE.EVAL_SEEDS))}", **kw))

    for model, epochs in PROBE.CELLS:
        where = cell_label(model, epochs)
        v = lambda m, c: values(table, model, epochs, m, c)
        claim("C1: FedDr+ beats FedAvg (late accuracy)", where, paired(v("feddr+", "late_acc"), v("fedavg", "late_acc")), **acc)
        claim("C2: FedDr+ beats the β-scaled control (late accuracy)", where,
              paired(v("feddr+", "late_acc"), v("control", "late_acc")), **acc)
        claim("C3: FedDr+ keeps more unseen-class accuracy than the control (local models)", where,
              paired(v("feddr+", "acc_unobs"), v("control", "acc_unobs")), **acc)
    for model in dict.fromkeys(m for m, _ in PROBE.CELLS):
        v = lambda e, c: values(table, model, e, "fedavg", c)
        claim("C4: FedAvg's extractor moves more at E = 5 than at E = 1 (weight change)", model,
              paired(v(5, "weight_change"), v(1, "weight_change")), margin=0.0, fmt=".4f")
        claim("C4: FedAvg forgets more unseen classes at E = 5 than at E = 1", model,
              paired(v(5, "forgetting_unobs"), v(1, "forgetting_unobs")), **acc)
        claim("C5: five local epochs widen FedDr+'s gap over FedAvg", model, paired(gap(table, model, 5), gap(table, model, 1)),
              **acc)
    for epochs in dict.fromkeys(e for _, e in PROBE.CELLS):
        claim("C5: removing BatchNorm widens FedDr+'s gap over FedAvg", f"E = {epochs}",
              paired(gap(table, "cnn_nobn", epochs), gap(table, "cnn_bn", epochs)), **acc)
    return out


def _mean_pm(series: pd.Series, scale: float = 1.0, fmt: str = ".1f") -> str:
    if series.empty:
        return "—"
    return fk.stats.interval(series.tolist()).format(fmt, scale)


def cell_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per cell and method: its lr, and over the verdict seeds the late and final accuracy (%)
    and the drift measures (mean ± half the 95 % t interval, n)."""
    rows = []
    for model, epochs in PROBE.CELLS:
        for method in PROBE.METHODS:
            v = lambda c: values(table, model, epochs, method, c).dropna()
            lr = PROBE.chosen_lr(method, model, epochs)
            rows.append({"cell": cell_label(model, epochs), "method": method, "lr": "?" if lr is None else f"{lr:g}",
                         "n": len(v("late_acc")), "late acc (%)": _mean_pm(v("late_acc"), 100),
                         "final acc (%)": _mean_pm(v("final_acc"), 100),
                         "weight change": _mean_pm(v("weight_change"), 1, ".4f"),
                         "unseen acc, local (%)": _mean_pm(v("acc_unobs"), 100),
                         "forgetting, unseen (pp)": _mean_pm(v("forgetting_unobs"), 100),
                         "FD:DR ratio": _mean_pm(v("grad_ratio_features"), 1, ".4f") if method == "feddr+" else "—",
                         "feature norm": _mean_pm(v("feature_norm"), 1, ".2f")})
    return pd.DataFrame(rows)


def grid_table(table: pd.DataFrame) -> pd.DataFrame:
    """The lr grids on seed 0: one row per cell and tuned method, the late accuracy at each lr run."""
    grid = table[table["role"] == "grid"]
    rows = []
    for model, epochs in PROBE.CELLS:
        for method in PROBE.TUNED:
            runs = grid[(grid["model"] == model) & (grid["local_epochs"] == epochs) & (grid["method"] == method)]
            chosen = PROBE.chosen_lr(method, model, epochs)
            cells = []
            for _, r in runs.sort_values("lr").iterrows():
                text = "diverged" if r["status"] != "done" else f"{100 * r['late_acc']:.1f}"
                cells.append(f"{r['lr']:g}: {text}" + (" (chosen)" if chosen is not None and r["lr"] == chosen else ""))
            rows.append({"cell": cell_label(model, epochs), "method": method, "late acc (%) at each lr": "; ".join(cells) or "—"})
    return pd.DataFrame(rows)


def grid_runs_left() -> dict[tuple[str, int], int]:
    """Per cell, the grid runs the lr rule has asked for that have not finished (from the run folders)."""
    items, _ = PROBE.plan()
    left: dict[tuple[str, int], int] = {}
    for it in items:
        if it.seed == PROBE.GRID_SEED and not PROBE.finished(it):
            left[(it.model, it.epochs)] = left.get((it.model, it.epochs), 0) + 1
    return left


def budget_table(table: pd.DataFrame, grid_left: dict[tuple[str, int], int] | None = None) -> pd.DataFrame:
    """What a cell's runs still cost: its measured seconds per round (the fastest finished run's, so a lower
    bound for every method: FedDr+ runs a teacher too), the runs not yet finished (the grid runs the rule has
    asked for, ``grid_left`` or else from the run folders, and 3 methods × 3 seeds of verdict runs less the
    finished ones) and the fewest core-hours they need (``runs left × rounds × s/round``; NaN where no run of
    the cell has finished). Grid points the rule may still add are not counted: every figure is a lower bound."""
    grid_left = grid_runs_left() if grid_left is None else grid_left
    done = table[table["status"] == "done"]
    rows = []
    for model, epochs in PROBE.CELLS:
        cell = done[(done["model"] == model) & (done["local_epochs"] == epochs)]
        per_round = float(cell["sec_per_round"].min()) if len(cell) else float("nan")
        verdict_left = len(PROBE.METHODS) * len(PROBE.EVAL_SEEDS) - int((cell["role"] == "evaluation").sum())
        left = verdict_left + grid_left.get((model, epochs), 0)
        rows.append({"cell": cell_label(model, epochs), "s per round (fastest run)": per_round,
                     "grid runs left": grid_left.get((model, epochs), 0), "verdict runs left": verdict_left,
                     "core-hours needed, at least": left * PROBE.BASE["rounds"] * per_round / 3600})
    return pd.DataFrame(rows)


def budget_text(table: pd.DataFrame, grid_left: dict[tuple[str, int], int] | None = None) -> str:
    """The budget's account: core-hours the finished runs recorded, against what the measured cells still need."""
    spent = float(table.loc[table["status"] == "done", "total_seconds"].sum()) / 3600
    need = budget_table(table, grid_left)
    measured = need.dropna(subset=["core-hours needed, at least"])
    at_least = float(measured["core-hours needed, at least"].sum())
    text = (f"Budget: {BUDGET_CORE_HOURS:g} core-hours. The finished runs recorded {spent:.1f} (runs stopped before "
            "their end, and diverged runs, record nothing). ")
    if measured.empty:
        return text + "No cell has a finished run yet, so nothing below is projected."
    text += (f"The runs left in the cells measured so far ({', '.join(measured['cell'])}) need at least "
             f"{at_least:.1f} more, at the seconds per round this machine measured. ")
    if spent + at_least > BUDGET_CORE_HOURS:
        text += ("**That is more than the budget holds**, before the unmeasured cells and any grid point the lr rule "
                 "may still add: the pre-registered cuts (whole cells, last first) cannot bring the probe inside it on this "
                 "machine, so its verdicts wait for faster hardware.")
    return text


def reference_drift() -> pd.DataFrame:
    """The same drift measures at the teaching scale (chapter 04's FedDr+ and control runs: ``cnn_bn``, E = 1,
    s = 5) and in the paper's models (``results/paper_regime_*.csv``: VGG-11 and MobileNet, FedDr+), each the
    mean over the run's evaluated rounds and seeds; what a source did not record is "—"."""
    rows = []
    ch04 = RESULTS / "ch04_runs.csv"
    if ch04.exists():
        h = pd.read_csv(ch04)
        h["forgetting_unobs"] = h["global_acc_unobs"] - h["acc_unobs"]
        for run, g in h.groupby("run", sort=False):
            rows.append({"source": f"teaching scale, chapter 04: {run}", "weight change": "—",
                         "unseen acc, local (%)": f"{100 * g['acc_unobs'].mean():.1f}",
                         "forgetting, unseen (pp)": f"{100 * g['forgetting_unobs'].mean():.1f}",
                         "FD:DR ratio": f"{g['grad_ratio_features'].mean():.4f}" if g["grad_ratio_features"].notna().any() else "—",
                         "feature norm": f"{g['feature_norm'].mean():.2f}"})
    for path in sorted(RESULTS.glob("paper_regime_*.csv")):
        h = pd.read_csv(path)
        for setting, g in h.groupby("setting", sort=False):
            rows.append({"source": f"paper model, {setting} ({path.name})", "weight change": "—",
                         "unseen acc, local (%)": "—", "forgetting, unseen (pp)": "—",
                         "FD:DR ratio": f"{g['grad_ratio_features'].mean():.4f}",
                         "feature norm": f"{g['feature_norm'].mean():.2f}"})
    return pd.DataFrame(rows)


def reading(claims_: list[fk.stats.Claim]) -> str:
    """The pre-registered reading of the verdicts, as far as they are decided."""
    c1 = {c.setting: c.verdict for c in claims_ if c.claim.startswith("C1")}
    c23 = [c for c in claims_ if c.claim.startswith(("C2", "C3"))]
    teaching = cell_label("cnn_bn", 1)
    if any(v == fk.stats.UNTESTABLE for v in c1.values()):
        return ("Not every cell has its seeds yet, so the pre-registered reading is not made: it needs C1 in "
                "all four cells.")
    held = [s for s, v in c1.items() if v == fk.stats.HELD]
    if not held:
        return ("C1 holds in no cell: neither removing BatchNorm nor five local epochs brings FedDr+'s advantage "
                "over FedAvg out at this model's size. By the pre-registered reading, what remains is the model "
                "and data scale (a paper-scale GPU run decides) or the method itself.")
    text = []
    if teaching not in held:
        text.append(f"C1 holds in {', '.join(held)} but not in the teaching cell ({teaching}): by the pre-registered "
                    "reading the teaching setting hides the advantage; C5's rows name the factor.")
    else:
        text.append(f"C1 holds in the teaching cell ({teaching}) itself, and in {', '.join(s for s in held if s != teaching) or 'no other'}.")
    fd = [c for c in c23 if c.setting in held]
    if fd and all(c.verdict != fk.stats.HELD for c in fd):
        text.append("Where C1 holds, C2 and C3 do not: the advantage comes from the smaller step β·lr, not from FD.")
    return " ".join(text)


def markdown(table: pd.DataFrame) -> str:
    """The whole of ``docs/drift.md``."""
    items, undecided = PROBE.plan()
    done = sum(PROBE.finished(it) for it in items)
    planned = len(items) + undecided
    claims_ = claims(table)
    ct = fk.stats.claims_table(claims_)
    md = lambda df: df.to_markdown(index=False)
    return "\n".join([
        "# Scale or method: the drift probe",
        "",
        "Generated by `python results/drift_report.py` from `results/drift_probe.csv`; the design, the lr rule, "
        "the comparisons, the margin and the cut order were fixed before the first run, in the docstring of "
        "`results/drift_probe.py`. Real CIFAR-10, 100 clients, shard s = 2, 10 clients per round, "
        f"{PROBE.BASE['rounds']} rounds, evaluated every {PROBE.BASE['eval_every']}; "
        "late accuracy is the mean of the last three evaluations.",
        "",
        f"**Progress: {done} of {planned} runs finished** (grids on seed 0, verdicts on seeds "
        f"{', '.join(map(str, PROBE.EVAL_SEEDS))}). Until every run has finished, the tables below hold what has; "
        "a comparison with fewer than two seeds on a side is untestable.",
        "",
        "## The lrs the rule chose (seed 0)",
        "",
        md(grid_table(table)),
        "",
        "## The budget",
        "",
        md(budget_table(table).assign(**{
            "s per round (fastest run)": lambda d: d["s per round (fastest run)"].map(lambda v: "—" if v != v else f"{v:.1f}"),
            "core-hours needed, at least": lambda d: d["core-hours needed, at least"].map(
                lambda v: "—" if v != v else f"{v:.1f}")})),
        "",
        budget_text(table),
        "",
        "## The cells (verdict seeds: mean ± half the 95 % t interval)",
        "",
        md(cell_table(table)),
        "",
        "## The pre-registered comparisons",
        "",
        md(ct),
        "",
        fk.stats.digest(ct),
        "",
        "## Drift beside the teaching scale and the paper's models",
        "",
        "Means over each run's evaluated rounds. The teaching-scale rows are chapter 04's runs (`cnn_bn`, E = 1, "
        "shard s = 5); the paper-model rows are `results/paper_regime_*.csv` (FedDr+ on VGG-11 and MobileNet, "
        "a few rounds), which recorded neither the probes nor the weight change.",
        "",
        md(reference_drift()),
        "",
        "## Scale or method: the pre-registered reading",
        "",
        reading(claims_),
        "",
    ])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--csv", default=str(RESULTS / "drift_probe.csv"), help="the probe's run table")
    p.add_argument("--out", default=str(DOC), help="where the report goes")
    args = p.parse_args(argv)
    fk.rundir.write_text(Path(args.out), markdown(load(Path(args.csv))))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
