"""ARCHIVED: the old-scale sweep (the `cnn`, 20 rounds of 5 clients) behind the CSVs beside it, kept as the
record of how they were made while the chapter's new-scale sweep (``results/ch07_sensitivity.py``) runs. It refuses to
run: its runs would land in the new sweep's folders.

Chapter 07's sweeps: sensitivity to β, client participation and local epochs (the paper's
Figure 6) on shard s = 5 CIFAR-10, two seeds (the paper uses α = 0.1; at this scale α = 0.1
leaves the base methods at chance, see ``ch06_synergy.py``).

The scale is half the other results chapters' (``fk.sweep.SWEEP_SCALE`` with 10 rounds, evaluated
once at the end), because the participation and epoch axes multiply the work by up to 10: the
base is 5 of 100 clients (participation 0.05) for 1 epoch. FedDr+ runs every axis; FedAvg, FedBABU
and SphereFed run participation and epochs. The two processes, one per seed, took 60 and 59 minutes on 2 CPU cores (measured):

    FEDDR_DATA_DIR=../shared/data python results/ch07_sensitivity.py --seeds 0 &
    FEDDR_DATA_DIR=../shared/data python results/ch07_sensitivity.py --seeds 1
    python results/ch07_sensitivity.py --collect-only
"""
import feddr_kit as fk
from _sweeps import main

BASE = {**fk.sweep.SWEEP_SCALE, "rounds": 10, "eval_every": 10, "partition": "shard", "shards_per_client": 5}
METHODS = ["feddr+", "fedavg", "fedbabu", "spherefed"]
# Each axis is its own setting (a sweep root), so the three grids are not multiplied together.
SETTINGS = {"beta": {}, "participation": {}, "epochs": {}}
GRIDS = {"beta": {"algorithm": ["feddr+"], "beta": [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0]},
         "participation": {"algorithm": METHODS, "clients_per_round": [5, 10, 20, 50]},
         "epochs": {"algorithm": METHODS, "local_epochs": [1, 2, 3, 5, 10]}}
SEEDS = [0, 1]  # the chapter's notebook reads these to know what a complete sweep holds

if __name__ == "__main__":
    raise SystemExit(f"{__file__} is archived; run results/ch07_sensitivity.py instead")
