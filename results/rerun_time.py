"""How long one seed of chapter 03's or 04's runs takes to rerun, from committed timings.

A seed of chapter 03 trains CE (``fedavg``) and DR; a seed of chapter 04 trains DR, FedDr+ and the control
(DR at FedDr+'s lr × β); ``results/ch03_04_probes.py`` trains all four. Each run is 120 rounds of 10 clients
for one local epoch (``cnn_bn``, s = 5), and every 5th round (24 of them) is also probed and evaluated. So a
run takes ``pace × (96 + 24 × probed)`` seconds, where

* ``pace`` is the seconds per training round of ``cnn_bn``, E = 1, 10 clients a round, measured on an idle
  2-core AMD EPYC VM by ``benchmarks/drift_probe_timing.py`` (``results/drift_probe_timing.csv``, the
  "alone" rows, at 1 and 2 torch threads; its config differs from the chapters' only in the shard count,
  which leaves a round's work unchanged). DR runs at FedAvg's pace: neither has a teacher to run;
* ``probed`` is how many plain rounds a probed and evaluated round costs, in the chapters' own committed
  runs (``results/runs/ch03_04_probes/seed*/<run>/``: the probed rounds' ``seconds`` in ``history.csv``
  against the plain rounds' share of ``total_seconds`` in ``summary.json``), averaged over seeds, FedDr+
  apart from the methods without a teacher.

Not counted: chapter 03's sections 2 and 4 and chapter 04's β sweep (one local round per client and
setting), which run after the runs.

    python results/rerun_time.py        # prints the minutes per seed
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

RESULTS = Path(__file__).resolve().parent
ROUNDS, PROBE_EVERY = 120, 5
RUNS = {"ce": "fedavg", "dr": "fedavg", "dr_beta_scaled": "fedavg", "feddrplus": "feddr+"}  # folder -> whose pace
CHAPTERS = {"03": ["ce", "dr"], "04": ["dr", "feddrplus", "dr_beta_scaled"],
            "ch03_04_probes.py": ["ce", "dr", "feddrplus", "dr_beta_scaled"]}


def machine(results: Path = RESULTS) -> str:
    """The machine the paces were measured on, as the timing CSV names it."""
    t = pd.read_csv(results / "drift_probe_timing.csv")
    return str(t.loc[t["condition"] == "alone", "machine"].iloc[0])


def pace(threads: int, results: Path = RESULTS) -> dict[str, float]:
    """Seconds per training round of ``cnn_bn``, E = 1, alone on ``threads`` torch threads: FedAvg and FedDr+."""
    t = pd.read_csv(results / "drift_probe_timing.csv")
    t = t[(t["condition"] == "alone") & (t["threads"] == threads) & (t["model"] == "cnn_bn") & (t["local_epochs"] == 1)]
    return t.groupby("method")["sec_per_round"].mean().to_dict()


def probed_factor(results: Path = RESULTS) -> dict[str, float]:
    """A probed and evaluated round's seconds over a plain round's in the chapters' committed runs, per pace
    (``fedavg``: the runs without a teacher; ``feddr+``), averaged over the runs and seeds."""
    factors: dict[str, list[float]] = {}
    for summary in sorted((results / "runs" / "ch03_04_probes").glob("seed*/*/summary.json")):
        total = json.loads(summary.read_text())["total_seconds"]
        probed = pd.read_csv(summary.parent / "history.csv")["seconds"]
        plain = (total - probed.sum()) / (ROUNDS - len(probed))
        factors.setdefault(RUNS[summary.parent.name], []).append(probed.mean() / plain)
    return {k: float(sum(v) / len(v)) for k, v in factors.items()}


def minutes(chapter: str, threads: int, results: Path = RESULTS) -> float:
    """Minutes to train one seed's runs of ``chapter`` (a key of :data:`CHAPTERS`) on ``threads`` threads."""
    p, f = pace(threads, results), probed_factor(results)
    probed = ROUNDS // PROBE_EVERY
    return sum(p[RUNS[r]] * (ROUNDS - probed + probed * f[RUNS[r]]) for r in CHAPTERS[chapter]) / 60


def about(m: float) -> int:
    """The figure the chapters quote: to the nearest 5 minutes."""
    return int(5 * round(m / 5))


def main() -> None:
    factors = ", ".join(f"{k} {v:.1f}" for k, v in probed_factor().items())
    print(f"paces measured on: {machine()}; a probed round costs this many plain rounds: {factors}")
    for chapter in CHAPTERS:
        for threads in (1, 2):
            m = minutes(chapter, threads)
            print(f"{chapter}: {m:.1f} min per seed on {threads} thread(s) (about {about(m)})")


if __name__ == "__main__":
    main()
