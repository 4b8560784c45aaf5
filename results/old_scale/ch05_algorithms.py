"""ARCHIVED: the old-scale sweep (the `cnn`, 20 rounds of 5 clients) behind the CSVs beside it, kept as the
record of how they were made while the chapter's new-scale sweep (``results/ch05_algorithms.py``) runs. It refuses to
run: its runs would land in the new sweep's folders.

Chapter 05's sweep: the nine algorithms on four non-iid CIFAR-10 settings (the paper's Table 3
at the results chapters' scale, ``fk.sweep.SWEEP_SCALE``), three seeds.

Each algorithm runs at its default lr (results/lr_grid.csv) and its own regularizer (fd for feddr+).
Two processes, one per core, finish in about an hour on 2 CPU cores:

    FEDDR_DATA_DIR=../shared/data python results/ch05_algorithms.py --settings s=2 s=5 &
    FEDDR_DATA_DIR=../shared/data python results/ch05_algorithms.py --settings "α=0.1" "α=0.3"
    python results/ch05_algorithms.py --collect-only      # rewrite results/ch05_algorithms.csv
"""
import feddr_kit as fk
from _sweeps import main

SETTINGS = {"s=2": {"partition": "shard", "shards_per_client": 2},
            "s=5": {"partition": "shard", "shards_per_client": 5},
            "α=0.1": {"partition": "dirichlet", "alpha": 0.1},
            "α=0.3": {"partition": "dirichlet", "alpha": 0.3}}
GRID = {"algorithm": fk.algorithms.algorithm_names()}
SEEDS = [0, 1, 2]  # the chapter's notebook reads these to know what a complete sweep holds

if __name__ == "__main__":
    raise SystemExit(f"{__file__} is archived; run results/ch05_algorithms.py instead")
