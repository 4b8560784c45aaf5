"""Learning-rate grid at the teaching scale (the paper's appendix C did the same at full scale).

Runs each algorithm at each candidate lr with ``Config()`` defaults otherwise (real CIFAR-10,
100 clients, shard s=2, cnn) and appends one row per run to ``results/lr_grid.csv``. The default
lr of each algorithm in ``feddr_kit/algorithms.py`` is the one with the best ``final_acc`` here.

    FEDDR_DATA_DIR=../shared/data OMP_NUM_THREADS=1 python results/lr_grid.py fedavg dr feddr+ spherefed fedetf
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

import feddr_kit as fk

CE_GRID = [0.01, 0.03, 0.1]
NORMALIZED_GRID = [0.03, 0.1, 0.3, 1.0]
# FedBABU, SCAFFOLD, FedNTD and FedExP take FedAvg's lr, as in the reference code's configs.
GRIDS = {"fedavg": CE_GRID, "dr": NORMALIZED_GRID, "feddr+": NORMALIZED_GRID,
         "spherefed": NORMALIZED_GRID, "fedetf": CE_GRID}
OUT = Path(__file__).with_name("lr_grid.csv")


def main(algorithms: list[str], seed: int = 0) -> None:
    data = fk.data.load("cifar10")
    for item in algorithms:  # "name" for its whole grid, or "name=lr" for one point
        algorithm, _, one = item.partition("=")
        for lr in [float(one)] if one else GRIDS[algorithm]:
            cfg = fk.Config(algorithm=algorithm, lr=lr, seed=seed, progress=False)
            row = {"algorithm": algorithm, "lr": lr, "seed": seed, "rounds": cfg.rounds, "local_epochs": cfg.local_epochs}
            try:
                s = fk.run(cfg, data=data).summary
            except FloatingPointError as err:  # a diverged lr is a grid result too
                row.update(final_acc=float("nan"), best_acc=float("nan"), last5_acc=float("nan"),
                           sec_per_round=float("nan"), note=f"diverged: {err}".split(";")[0])
            else:
                row.update(final_acc=s["final_acc"], best_acc=s["best_acc"], last5_acc=s["last5_acc"],
                           sec_per_round=s["sec_per_round"], note="")
            print(row, flush=True)
            pd.DataFrame([row]).to_csv(OUT, mode="a", header=not OUT.exists(), index=False)


if __name__ == "__main__":
    main(sys.argv[1:] or list(GRIDS))
