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
TIMING = RESULTS / "drift_probe_timing.csv"  # seconds per round measured on an idle machine (benchmarks/drift_probe_timing.py)
NO_WORKING_LR = "no working lr found by the rule"
STILL_RUNNING = "verdict seeds still running"
# C1 is the paper's claim (FedDr+ beats FedAvg); C2 and C3 put its credit to the distillation against the
# beta-scaled control, which the paper does not run; C4 and C5 are the probe's own hypotheses
SOURCE = {"C1": "paper", "C2": "course test", "C3": "course test"}


def _script(name: str):
    """``results/<name>.py`` as a module (the results scripts are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, RESULTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


PROBE = _script("drift_probe")  # its design constants are the one source of the plan
FD_DR = _script("fd_dr_ratio")  # the one FD:DR table, whose lr phases and number format the reference rows share
# The probe's own ratio is pre-registered as the mean over all its evaluated rounds, lr decays included.
PROBE_RATIO = f"FD:DR ratio, all {PROBE.BASE['rounds'] // PROBE.BASE['eval_every']} evaluated rounds"


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
    ``weight_change``). A comparison that reads a cell whose verdict seeds are not all in
    (:func:`complete_cells`) is untestable, its setting saying :data:`STILL_RUNNING`: the pre-registration reads
    a cell's verdicts once its three seeds are in, never from the seeds that happen to be done."""
    return [c for c, _ in _claims_and_cells(table)]


def decided_claims(table: pd.DataFrame) -> list[fk.stats.Claim]:
    """The comparisons of :func:`claims` every cell of which has its verdict seeds in (C4 and C5 read two
    cells): their verdicts, or the reason there is none ("no working lr found by the rule"). What the
    chapters and the scorecard show."""
    done = set(complete_cells(table))
    return [c for c, cells in _claims_and_cells(table) if cells <= done]


def _claims_and_cells(table: pd.DataFrame) -> list[tuple[fk.stats.Claim, set[str]]]:
    """Each comparison of :func:`claims` with the labels of the cells it reads."""
    out = []
    acc = {"scale": 100, "unit": " pp", "fmt": ".1f", "margin": ACC_MARGIN}
    done = set(complete_cells(table))

    def claim(text, setting, diff, needs, **kw):
        cells = {cell_label(mo, e) for mo, e, _ in needs}
        # the amendment: a comparison with a method whose chosen lr does not train is no verdict on the method
        failing = [f"{m} ({cell_label(mo, e)})" for mo, e, m in needs if PROBE.trains(m, mo, e) is False]
        if failing:
            setting = f"{setting}: {NO_WORKING_LR} for {', '.join(failing)}"
        elif not cells <= done:
            setting = f"{setting}: {STILL_RUNNING}"
        out.append((fk.stats.Claim(text, SOURCE.get(text[:2], "chapter hypothesis"),
                                   setting, diff, seeds=f"seeds {', '.join(map(str, PROBE.EVAL_SEEDS))}",
                                   testable=not failing and cells <= done, **kw), cells))

    for model, epochs in PROBE.CELLS:
        where = cell_label(model, epochs)
        v = lambda m, c: values(table, model, epochs, m, c)
        both, fd = [(model, epochs, "feddr+"), (model, epochs, "fedavg")], [(model, epochs, "feddr+")]
        claim("C1: FedDr+ beats FedAvg (late accuracy)", where, paired(v("feddr+", "late_acc"), v("fedavg", "late_acc")),
              both, **acc)
        claim("C2: FedDr+ beats the β-scaled control (late accuracy)", where,
              paired(v("feddr+", "late_acc"), v("control", "late_acc")), fd, **acc)
        claim("C3: FedDr+ keeps more unseen-class accuracy than the control (local models)", where,
              paired(v("feddr+", "acc_unobs"), v("control", "acc_unobs")), fd, **acc)
    for model in dict.fromkeys(m for m, _ in PROBE.CELLS):
        v = lambda e, c: values(table, model, e, "fedavg", c)
        fedavg = [(model, e, "fedavg") for e in (5, 1)]
        claim("C4: FedAvg's extractor moves more at E = 5 than at E = 1 (weight change)", model,
              paired(v(5, "weight_change"), v(1, "weight_change")), fedavg, margin=0.0, fmt=".4f")
        claim("C4: FedAvg forgets more unseen classes at E = 5 than at E = 1", model,
              paired(v(5, "forgetting_unobs"), v(1, "forgetting_unobs")), fedavg, **acc)
        claim("C5: five local epochs widen FedDr+'s gap over FedAvg", model, paired(gap(table, model, 5), gap(table, model, 1)),
              [(model, e, m) for e in (5, 1) for m in PROBE.TUNED], **acc)
    for epochs in dict.fromkeys(e for _, e in PROBE.CELLS):
        claim("C5: removing BatchNorm widens FedDr+'s gap over FedAvg", f"E = {epochs}",
              paired(gap(table, "cnn_nobn", epochs), gap(table, "cnn_bn", epochs)),
              [(mo, epochs, m) for mo in ("cnn_nobn", "cnn_bn") for m in PROBE.TUNED], **acc)
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
                         PROBE_RATIO: _mean_pm(v("grad_ratio_features"), 1, ".4f") if method == "feddr+" else "—",
                         "feature norm": _mean_pm(v("feature_norm"), 1, ".2f")})
    return pd.DataFrame(rows)


def cell_progress(table: pd.DataFrame) -> pd.DataFrame:
    """One row per cell, in the amended order: its finished grid runs, its finished verdict runs against those
    planned (3 seeds of each method whose lr is undecided or trains), and where it stands: "no run finished",
    "lr grids", "verdict seeds", or "seeds in" (every planned verdict run finished: its comparisons are
    read)."""
    rows = []
    for model, epochs in PROBE.CELLS:
        cell = table[(table["model"] == model) & (table["local_epochs"] == epochs)]
        grid_done = int((cell["role"] == "grid").sum())
        verdict_done = len(evaluation(cell))
        planned = sum(PROBE.trains(m, model, epochs) is not False for m in PROBE.METHODS) * len(PROBE.EVAL_SEEDS)
        decided = all(PROBE.chosen_lr(m, model, epochs) is not None for m in PROBE.TUNED)
        stage = ("seeds in" if decided and verdict_done >= planned else "verdict seeds" if verdict_done or decided
                 else "lr grids" if grid_done else "no run finished")
        rows.append({"cell": cell_label(model, epochs), "grid runs finished": grid_done,
                     "verdict runs finished": f"{verdict_done} of {planned}", "stage": stage})
    return pd.DataFrame(rows)


def complete_cells(table: pd.DataFrame) -> list[str]:
    """The labels of the cells whose verdict seeds are all in, in the amended order."""
    progress = cell_progress(table)
    return progress.loc[progress["stage"] == "seeds in", "cell"].tolist()


def all_cells_in(table: pd.DataFrame) -> bool:
    """True once every cell has its verdict seeds in: the probe has run to its end."""
    return len(complete_cells(table)) == len(PROBE.CELLS)


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


def idle_pace(path: Path = TIMING) -> dict[tuple[str, int, str], float]:
    """Seconds per training round of each (model, E, method) on an idle machine, one process on one torch thread
    (the probe's setting): the mean of the "alone" rows of ``path``. The control runs at FedAvg's pace (DR has
    no teacher to run, as FedAvg has none)."""
    if not path.exists():
        return {}
    t = pd.read_csv(path)
    t = t[(t["condition"] == "alone") & (t["threads"] == 1)]
    pace = {(r.model, int(r.local_epochs), r.method): float(r.sec_per_round)
            for r in t.groupby(["model", "local_epochs", "method"], as_index=False)["sec_per_round"].mean().itertuples()}
    pace.update({(m, e, "control"): v for (m, e, meth), v in list(pace.items()) if meth == "fedavg"})
    return pace


def runs_left(table: pd.DataFrame, grid_left: dict[tuple[str, int, str], int] | None = None
              ) -> dict[tuple[str, int, str], tuple[int, int]]:
    """Per (model, E, method), the runs not yet finished, as (grid runs, verdict runs): the grid runs the lr rule
    has asked for (``grid_left``, or else from the run folders), and 3 seeds of verdict runs less the finished
    ones for a method whose lr is undecided or trains (none for one whose chosen lr does not train). Grid points
    the rule may still add are not counted."""
    if grid_left is None:
        items, _ = PROBE.plan()
        grid_left = {}
        for it in items:
            if it.seed == PROBE.GRID_SEED and not PROBE.finished(it):
                grid_left[(it.model, it.epochs, it.method)] = grid_left.get((it.model, it.epochs, it.method), 0) + 1
    done = evaluation(table)
    left = {}
    for model, epochs in PROBE.CELLS:
        for method in PROBE.METHODS:
            verdict = 0
            if PROBE.trains(method, model, epochs) is not False:
                ran = (done["model"] == model) & (done["local_epochs"] == epochs) & (done["method"] == method)
                verdict = len(PROBE.EVAL_SEEDS) - int(ran.sum())
            left[(model, epochs, method)] = (grid_left.get((model, epochs, method), 0), verdict)
    return left


def timing_table(path: Path = TIMING) -> pd.DataFrame:
    """The idle timing: one row per (model, E, method), one column per (condition, threads) measured, each the
    mean seconds per training round ("—" where not measured)."""
    if not path.exists():
        return pd.DataFrame()
    t = pd.read_csv(path)
    t["setting"] = t["condition"] + ", " + t["threads"].astype(str) + (" thread" + (t["threads"] > 1).map({True: "s", False: ""}))
    wide = t.pivot_table(index=["model", "local_epochs", "method"], columns="setting", values="sec_per_round", aggfunc="mean",
                         sort=False)
    order = {cell: i for i, cell in enumerate(PROBE.CELLS)}
    wide = wide.reset_index()
    wide = wide.iloc[sorted(range(len(wide)), key=lambda i: (order.get((wide["model"][i], wide["local_epochs"][i]), 99), i))]
    wide.insert(0, "cell", [cell_label(m, e) for m, e in zip(wide.pop("model"), wide.pop("local_epochs"))])
    return wide.map(lambda v: ("—" if v != v else f"{v:.1f}") if isinstance(v, float) else v)


def spent_hours(table: pd.DataFrame) -> float:
    """Machine-hours the runs finished after the amendment took: each run's median seconds per round times its
    rounds (a run paused with ``--pause`` may count the pause in one round's wall time, which the median leaves
    out), over the :data:`PROBE.PROCESSES` probe processes that share the machine, each on one core."""
    done = table[table["status"] == "done"]
    keys = zip(done["model"], done["local_epochs"], done["method"], done["lr"], done["seed"])
    after = [k not in PROBE.BEFORE_AMENDMENT for k in keys]
    return float(done.loc[after, "sec_per_round"].sum()) * PROBE.BASE["rounds"] / 3600 / PROBE.PROCESSES


def budget_table(table: pd.DataFrame, grid_left: dict[tuple[str, int, str], int] | None = None) -> pd.DataFrame:
    """Per cell, in the amended order: the idle seconds per training round of FedAvg and FedDr+, the runs not yet
    finished (:func:`runs_left`) and the fewest machine-hours they need (runs left × rounds × idle s/round of
    their method, over the :data:`PROBE.PROCESSES` processes that share the machine; evaluations and grid
    points the rule may still add are not counted, so a lower bound; NaN where a method with runs left has no
    measured pace)."""
    pace, left = idle_pace(), runs_left(table, grid_left)
    rows = []
    for model, epochs in PROBE.CELLS:
        cell = {m: left[(model, epochs, m)] for m in PROBE.METHODS}
        need = sum(sum(n) * PROBE.BASE["rounds"] * pace.get((model, epochs, m), float("nan"))
                   for m, n in cell.items() if sum(n))
        rows.append({"cell": cell_label(model, epochs),
                     "s per round, idle (FedAvg)": pace.get((model, epochs, "fedavg"), float("nan")),
                     "s per round, idle (FedDr+)": pace.get((model, epochs, "feddr+"), float("nan")),
                     "grid runs left": sum(g for g, _ in cell.values()),
                     "verdict runs left": sum(v for _, v in cell.values()),
                     "machine-hours left, at least": need / 3600 / PROBE.PROCESSES})
    return pd.DataFrame(rows)


def budget_text(table: pd.DataFrame, grid_left: dict[tuple[str, int, str], int] | None = None) -> str:
    """The budget's account in machine-hours: the amended budget, what the runs finished after the amendment
    recorded, what the runs left need at least at the idle pace, and the cut the amendment fixes if that is
    more than is left."""
    spent = spent_hours(table)
    need = budget_table(table, grid_left)["machine-hours left, at least"]
    text = (f"Budget: {PROBE.BUDGET_MACHINE_HOURS:g} machine-hours from the amendment on ({PROBE.PROCESSES} probe "
            f"processes side by side, one torch thread each, so a run's wall time counts 1/{PROBE.PROCESSES}). The runs "
            f"finished since took {spent:.1f}; a run still going, paused, or diverged counts nothing here until it "
            "finishes. ")
    if need.isna().any():
        return text + "Not every cell's pace is measured, so the runs left are not projected."
    if need.sum() == 0 and all_cells_in(table):
        return text + (f"Every cell has its verdict seeds in, so no cell was cut: the probe took {spent:.1f} of its "
                       f"{PROBE.BUDGET_MACHINE_HOURS:g} machine-hours.")
    text += (f"The runs left need at least {need.sum():.1f} more at the idle pace (evaluations, and grid points "
             f"the lr rule may still add, not counted), against {PROBE.BUDGET_MACHINE_HOURS - spent:.1f} left. ")
    if spent + need.sum() > PROBE.BUDGET_MACHINE_HOURS:
        text += (f"**That is more than the budget holds:** by the amendment the last cell in the order, "
                 f"({cell_label(*PROBE.CELLS[-1])}), is cut whole if the budget runs out.")
    else:
        text += "That fits the budget."
    return text


def reference_drift() -> pd.DataFrame:
    """The same drift measures at the teaching scale (chapter 04's FedDr+ and control runs: ``cnn_bn``, E = 1,
    s = 5) and in the paper's models (``results/paper_regime_*.csv``: VGG-11 and MobileNet, FedDr+), each the
    mean over the run's evaluated rounds and seeds; what a source did not record is "—". The FD:DR ratio is
    given twice, as ``docs/fd_dr_ratio.md`` gives it: over the rounds at full lr (the one phase every source
    has, so the one to compare) and over every evaluated round (the probe's own measure, decays included;
    the paper models' runs kept a constant lr, so theirs is their full-lr figure)."""
    rows = []
    full, every = "FD:DR ratio, rounds at full lr", "FD:DR ratio, all evaluated rounds"

    def ratios(g: pd.DataFrame, constant_lr: bool) -> dict[str, str]:
        if not g["grad_ratio_features"].notna().any():
            return {full: "—", every: "—"}
        at_full = g["lr"] == g.groupby("seed")["lr"].transform("max")
        return {full: FD_DR.fmt(g.loc[at_full, "grad_ratio_features"].mean()),
                every: "= full lr (constant lr)" if constant_lr else FD_DR.fmt(g["grad_ratio_features"].mean())}

    ch04 = RESULTS / "ch04_runs.csv"
    if ch04.exists():
        h = pd.read_csv(ch04)
        h["forgetting_unobs"] = h["global_acc_unobs"] - h["acc_unobs"]
        for run, g in h.groupby("run", sort=False):
            rows.append({"source": f"teaching scale, chapter 04: {run}", "weight change": "—",
                         "unseen acc, local (%)": f"{100 * g['acc_unobs'].mean():.1f}",
                         "forgetting, unseen (pp)": f"{100 * g['forgetting_unobs'].mean():.1f}",
                         **ratios(g, constant_lr=False), "feature norm": f"{g['feature_norm'].mean():.2f}"})
    for path in sorted(RESULTS.glob("paper_regime_*.csv")):
        h = pd.read_csv(path).assign(seed=0)
        for setting, g in h.groupby("setting", sort=False):
            rows.append({"source": f"paper model, {setting} ({path.name})", "weight change": "—",
                         "unseen acc, local (%)": "—", "forgetting, unseen (pp)": "—",
                         **ratios(g, constant_lr=True), "feature norm": f"{g['feature_norm'].mean():.2f}"})
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


def progress_text(table: pd.DataFrame, done: int, planned: int) -> str:
    """The report's first paragraph: how many of the ``planned`` runs are ``done``, and what that means for
    reading the tables, or, once every cell has its verdict seeds in, that the probe ran to its end."""
    seeds = f"(grids on seed 0, verdicts on seeds {', '.join(map(str, PROBE.EVAL_SEEDS))})"
    if done == planned and all_cells_in(table):
        return (f"**All {planned} runs finished** {seeds}: every cell has its verdict seeds in, none was cut, and "
                "every pre-registered comparison below is read.")
    return (f"**Progress: {done} of {planned} runs finished** {seeds}. Until every run has finished, the tables "
            "below hold what has; a comparison with fewer than two seeds on a side is untestable. The cells run one "
            "at a time, in the amended order (cheapest first); a cell's comparisons are read when its verdict seeds "
            "are all in.")


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
        progress_text(table, done, planned),
        "",
        md(cell_progress(table)),
        "",
        "## The lrs the rule chose (seed 0)",
        "",
        md(grid_table(table)),
        "",
        "## How the probe runs, and the budget",
        "",
        "Seconds per training round on this machine (2 cores), measured with nothing else running: "
        "`benchmarks/drift_probe_timing.py`, two rounds of each cell's own config (the last, evaluated, round not "
        "counted), rows in `results/drift_probe_timing.csv`. Conditions: one process alone on 1 or 2 torch threads; "
        "two processes side by side (each row is one of the two).",
        "",
        md(timing_table()),
        "",
        f"The probe runs as {PROBE.PROCESSES} processes side by side, one torch thread each (the amendment's setting: "
        "the most rounds per hour measured). The budget, in machine-hours at the one-thread pace measured alone:",
        "",
        md(budget_table(table).map(lambda v: ("—" if v != v else f"{v:.1f}") if isinstance(v, float) else v)),
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
        "shard s = 5, 120 rounds with the lr × 0.1 after rounds 60 and 90); the paper-model rows are "
        "`results/paper_regime_*.csv` (FedDr+ on VGG-11 and MobileNet, a few rounds at constant lr), which "
        "recorded neither the probes nor the weight change. The FD:DR ratio falls about tenfold at each lr "
        "decay, so only its full-lr column compares the sources like for like; the cell table's "
        f"\"{PROBE_RATIO}\" mixes the probe's lr phases as the all-rounds column does. "
        "`docs/fd_dr_ratio.md` has the ratio of every source by lr phase.",
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
