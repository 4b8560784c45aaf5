"""FedDr+'s FD:DR ratio, like for like: one table from every committed measurement of it.

The ratio is the history column ``grad_ratio_features`` (``feddr_kit/instruments.py``):
``‖∇_h (1-β)·L_FD‖ / ‖∇_h β·L_DR‖``, a ratio of gradient norms (not of loss values) with respect to the
batch's penultimate features ``h``, with the weights β and 1-β included as they enter FedDr+'s loss
(β = 0.9 everywhere here), averaged over every local step of every sampled client of an evaluated round.

The ratio's numerator is the local features' drift from the global model's, and that drift shrinks with
the step, so the ratio falls about tenfold at each ×0.1 lr decay; it also falls within the full-lr rounds
as the model learns. A mean over rounds therefore says little unless its rounds are named. The table has
one row per lr phase (the rounds at full lr; after the first decay; after the second) and one column per
setting and machine; each cell is the mean over that phase's evaluated rounds of every seed, with the
range and the number of (round, seed) values. The sources, all FedDr+ on real CIFAR-10:

* ``ch04_runs.csv``: the teaching scale (``cnn_bn``, s = 5, E = 1, lr 3, 10 of 100 clients a round, the
  paper's lr schedule over 120 rounds), chapter 04's runs, seeds 0-2, evaluated every 5 rounds;
* ``paper_regime_cpu.csv``: the paper's models at its lrs, a few constant-lr rounds of 2-3 clients on a
  CPU (one thread);
* ``paper_regime_nvidia_h100_80gb_hbm3.csv``: the same models for 14-23 constant-lr rounds of 10 clients
  on an NVIDIA H100.

No ratio has been measured on CIFAR-100 (the paper's MobileNet ran here on CIFAR-10 only).

    python results/fd_dr_ratio.py       # writes results/fd_dr_ratio.csv and docs/fd_dr_ratio.md
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

RESULTS = Path(__file__).resolve().parent
DOC = RESULTS.parent / "docs" / "fd_dr_ratio.md"
CSV = RESULTS / "fd_dr_ratio.csv"
H100 = "paper_regime_nvidia_h100_80gb_hbm3.csv"
FIRST_ROUNDS = 3  # the "first evaluated rounds at full lr" row: what the shortest source (VGG-11 on the CPU) has

# The lr phases, by the number of ×0.1 decays since the run's first lr, and the row labels of the table.
PHASES = {0: "full lr", 1: "after the first decay (lr × 0.1)", 2: "after the second decay (lr × 0.01)"}
ROWS = {
    "full lr": "rounds at full lr",
    f"full lr, first {FIRST_ROUNDS}": f"rounds at full lr: the first {FIRST_ROUNDS} evaluated",
    PHASES[1]: PHASES[1],
    PHASES[2]: PHASES[2],
    "all": "every evaluated round, phases mixed (a mean over the run's schedule: not a phase)",
}


def _model_name(model: str) -> str:
    return {"vgg11": "VGG-11", "mobilenet": "MobileNet"}.get(model, model)


def measurements(results: Path = RESULTS) -> pd.DataFrame:
    """Every committed FedDr+ measurement of the ratio, one row per (column, seed, evaluated round): the table's
    column label, dataset, machine, seed, round, lr phase (×0.1 decays since the first lr) and ``ratio``."""
    frames = []
    ch04 = pd.read_csv(results / "ch04_runs.csv")
    ch04 = ch04[(ch04["algorithm"] == "feddr+") & ch04["grad_ratio_features"].notna()].copy()
    ch04["lr0"] = ch04.groupby("seed")["lr"].transform("max")
    frames.append(ch04.assign(column="cnn_bn (teaching scale, chapter 04), s = 5, E = 1, lr 3, 10 clients",
                              machine="2-core CPU, 1 thread a run"))
    cpu = pd.read_csv(results / "paper_regime_cpu.csv").assign(seed=0, machine="CPU, 1 thread")
    h100 = pd.read_csv(results / H100).assign(seed=0)
    h100["machine"] = h100["device"]
    for table in (cpu, h100):
        table["column"] = [f"{_model_name(m)}, s = {s}, E = {e}, lr {lr:g}, {c} clients"
                           for m, s, e, lr, c in zip(table["model"], table["shards_per_client"], table["local_epochs"],
                                                     table["lr0"], table["clients_per_round"])]
        frames.append(table)
    keep = ["column", "machine", "seed", "round", "lr", "lr0", "grad_ratio_features"]
    out = pd.concat([f[keep] for f in frames], ignore_index=True).rename(columns={"grad_ratio_features": "ratio"})
    out.insert(1, "dataset", "CIFAR-10")
    out["phase"] = [round(math.log10(lr0 / lr)) for lr, lr0 in zip(out["lr"], out["lr0"])]
    return out.drop(columns="lr0")


def _rounds(rounds: pd.Series) -> str:
    """The evaluated rounds, short: "1-14", or "5, 10, ..., 60" when they are every k-th round."""
    r = sorted(set(int(x) for x in rounds))
    steps = {b - a for a, b in zip(r, r[1:])}
    if len(r) > 3 and steps == {r[1] - r[0]} and r[1] - r[0] > 1:
        return f"{r[0]}, {r[1]}, ..., {r[-1]}"
    return f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0])


def cells(m: pd.DataFrame) -> pd.DataFrame:
    """One row per (column, table row): the mean, min and max of the ratio over the row's (round, seed) values,
    and ``n``, their number; a phase a source did not reach has no row."""
    rows = []
    for (column, dataset, machine), g in m.groupby(["column", "dataset", "machine"], sort=False):
        full = g[g["phase"] == 0]
        first = full[full.groupby("seed")["round"].rank(method="first") <= FIRST_ROUNDS]
        groups = {"full lr": full, f"full lr, first {FIRST_ROUNDS}": first,
                  **{PHASES[p]: g[g["phase"] == p] for p in (1, 2)}, "all": g}
        for key, values in groups.items():
            if values.empty:
                continue
            rows.append({"column": column, "dataset": dataset, "machine": machine, "row": ROWS[key],
                         "mean": values["ratio"].mean(), "min": values["ratio"].min(), "max": values["ratio"].max(),
                         "n": len(values), "seeds": values["seed"].nunique(),
                         "rounds": _rounds(values["round"])})
    return pd.DataFrame(rows)


def fmt(x: float) -> str:
    """Two significant digits in plain notation (0.014, 0.00077, 0.000062): the form the docs quote."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    return f"{x:.{max(1, 1 - math.floor(math.log10(abs(x))))}f}"


def cell_text(r: pd.Series) -> str:
    return f"**{fmt(r['mean'])}** ({fmt(r['min'])}–{fmt(r['max'])}), n = {r['n']}"


def table(c: pd.DataFrame, dataset: str = "CIFAR-10") -> pd.DataFrame:
    """The markdown table's frame: a row for the machine and one for the rounds and seeds read, then one row
    per lr phase; one column per setting and machine. A constant-lr source's mixed row is its full-lr row."""
    c = c[c["dataset"] == dataset]
    columns = list(dict.fromkeys(c["column"]))
    body = {col: {ROWS[k]: "not measured" for k in ROWS} for col in columns}
    head = {}
    for col in columns:
        g = c[c["column"] == col].set_index("row")
        every = g.loc[ROWS["all"]]
        head[col] = {"machine": g["machine"].iloc[0],
                     "evaluated rounds × seeds": f"rounds {every['rounds']} × {every['seeds']} seed{'s' if every['seeds'] > 1 else ''}"}
        for row, r in g.iterrows():
            body[col][row] = cell_text(r)
        if ROWS[PHASES[1]] not in g.index:  # constant lr: every round is a full-lr round
            body[col][ROWS["all"]] = "= rounds at full lr (constant lr)"
    frame = pd.concat([pd.DataFrame(head), pd.DataFrame(body).reindex(list(ROWS.values()))])
    frame.index.name = "lr phase"
    return frame.reset_index()


def value(c: pd.DataFrame, column_starts: str, row: str, stat: str = "mean", machine: str | None = None) -> float:
    """One number of the table: the cell whose column starts with ``column_starts`` (and whose machine starts
    with ``machine``), in table row ``row`` (a key of :data:`ROWS`)."""
    hit = c[c["column"].str.startswith(column_starts) & (c["row"] == ROWS[row])]
    if machine is not None:
        hit = hit[hit["machine"].str.startswith(machine)]
    if len(hit) != 1:
        raise KeyError(f"{len(hit)} cells match {column_starts!r}, {row!r}, {machine!r}")
    return float(hit[stat].iloc[0])


def criterion_rounds(results: Path = RESULTS) -> pd.Series:
    """The same teaching-scale runs as read by ``docs/teaching_scale.md``'s criterion 3: FedDr+'s default at
    seeds 0-2 evaluated every 20 rounds (``teaching_scale_curves.csv``), the full-lr rounds (20, 40, 60)."""
    curves = pd.read_csv(results / "teaching_scale_curves.csv")
    feddr = curves[curves["arm"] == "default feddr+"]
    return feddr[feddr["lr"] == feddr["lr"].max()]["grad_ratio_features"]


def markdown(c: pd.DataFrame, results: Path = RESULTS) -> str:
    crit = criterion_rounds(results)
    teaching = c["column"].iloc[0]
    full, d1, d2 = (fmt(value(c, "cnn_bn", k)) for k in ("full lr", PHASES[1], PHASES[2]))
    return "\n".join([
        "# FD:DR: how hard FedDr+'s distillation pulls, next to dot-regression",
        "",
        "Generated by `python results/fd_dr_ratio.py` from the committed CSVs named below (the numbers are "
        "also in `results/fd_dr_ratio.csv`). This is the one table of the ratio: the README, the chapters and "
        "the other pages quote its cells, with the lr phase named, or link here.",
        "",
        "**What the ratio is.** `grad_ratio_features` = ‖∇_h (1−β)·L_FD‖ / ‖∇_h β·L_DR‖: the norm of the "
        "distillation term's gradient over the norm of the dot-regression term's, with respect to the batch's "
        "penultimate features h, **β included** (β = 0.9: each term as it enters FedDr+'s loss), averaged over "
        "every local step of every sampled client of an evaluated round (`feddr_kit/instruments.py`). It is a "
        "ratio of gradients, not of loss values.",
        "",
        "**Why the rows are lr phases.** The numerator is the local features' drift from the global model's "
        "features, which shrinks with the step: the ratio falls about tenfold at each ×0.1 lr decay "
        f"(teaching scale: {full} → {d1} → {d2}), and within the full-lr rounds it falls as the model learns "
        f"(hence the row of the first {FIRST_ROUNDS} evaluated rounds). Compare cells in one row only.",
        "",
        "## CIFAR-10 (FedDr+, β = 0.9, shard partition of 100 clients)",
        "",
        "Each cell: **mean** (min–max), n = the (round, seed) values averaged: the rounds evaluated in that "
        "phase × the seeds. Clients: those sampled each round. Sources: the teaching-scale column is `results/ch04_runs.csv` (chapter 04's "
        "runs: lr × 0.1 after rounds 60 and 90 of 120, evaluated every 5 rounds); the paper models' columns "
        "are `results/paper_regime_cpu.csv` (`results/paper_regime_cpu.py`) and "
        f"`results/{H100}` (`benchmarks/gpu_check.py`), both at constant lr, so only their full-lr rows exist.",
        "",
        table(c).to_markdown(index=False),
        "",
        f"The same teaching-scale runs read only at rounds 20, 40 and 60 (`results/teaching_scale_curves.csv`, "
        f"as `docs/teaching_scale.md`'s criterion 3 read them) give **{fmt(crit.mean())}** at full lr "
        f"(n = {len(crit)}); every fifth round gives {full}, the table's figure, because it also reads rounds "
        "5-15, where the ratio is highest (the table's row of the first evaluated rounds).",
        "",
        "## CIFAR-100",
        "",
        "Not measured: no committed run records the ratio on CIFAR-100. The paper's CIFAR-100 model, "
        "MobileNet, appears above on CIFAR-10 only (`benchmarks/gpu_check.py` ran it at CIFAR-100's shape on "
        "synthetic data, for timing).",
        "",
    ])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--out", default=str(DOC), help="the markdown page")
    p.add_argument("--csv", default=str(CSV), help="the table's cells, one row each")
    args = p.parse_args(argv)
    c = cells(measurements())
    c.to_csv(args.csv, index=False)
    Path(args.out).write_text(markdown(c))
    print(f"wrote {args.csv} and {args.out}")


if __name__ == "__main__":
    main()
