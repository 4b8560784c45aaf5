"""ARCHIVED: the old-scale sweep (the `cnn`, 20 rounds of 5 clients) behind the CSVs beside it, kept as the
record of how they were made while the chapter's new-scale sweep (``results/ch05_algorithms.py``) runs. It refuses to
run: its runs would land in the new sweep's folders.

Every algorithm at the teaching defaults (``Config()``, its default lr), with probes, over seeds.

Appends one row per run to ``results/teaching_table.csv``: final / best / last-5 accuracy, seconds
per round and per run, and the probe columns averaged over all rounds (local-model alignment and
accuracy on observed vs unobserved classes, feature drift from the global model).

    FEDDR_DATA_DIR=../shared/data python results/teaching_table.py --seeds 0 1 --algorithms fedavg dr feddr+
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import feddr_kit as fk

OUT = Path(__file__).with_name("teaching_table.csv")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithms", nargs="+", default=fk.algorithms.algorithm_names())
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    args = p.parse_args()
    data = fk.data.load("cifar10")
    for seed in args.seeds:
        for algorithm in args.algorithms:
            result = fk.run(fk.Config(algorithm=algorithm, seed=seed, probes=True, progress=False), data=data)
            s = result.summary
            probes = result.history[fk.probes.PROBE_COLUMNS].mean().round(4).to_dict()
            row = {"algorithm": algorithm, "seed": seed, "lr": s["lr0"], "final_acc": round(s["final_acc"], 4),
                   "best_acc": round(s["best_acc"], 4), "last5_acc": round(s["last5_acc"], 4),
                   "sec_per_round": round(s["sec_per_round"], 2), "sec_per_run": round(s["total_seconds"], 1), **probes}
            print(row, flush=True)
            pd.DataFrame([row]).to_csv(OUT, mode="a", header=not OUT.exists(), index=False)


if __name__ == "__main__":
    raise SystemExit(f"{__file__} is archived; results/ch05_algorithms.py runs every algorithm at the teaching scale")
