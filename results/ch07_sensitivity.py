"""Chapter 07's sweeps: sensitivity to β, client participation and local epochs (the paper's
sensitivity figure, ``fig:sensitivity``) on shard s = 5 CIFAR-10, three seeds.

The paper runs these on CIFAR-100 at its default 10 % participation and 3 epochs; its CIFAR-10
appendix tunes the epochs per algorithm. Here the base is the teaching scale
(``fk.sweep.TEACHING_SCALE``: ``cnn_bn``, 10 of 100 clients per round, 1 local epoch) at a third of its
rounds, evaluated once at the end, because the participation and epoch axes multiply the work by up to
10. Budget cut, decided before any run (the chapter's budget is 3 hours of 2 CPU cores, about 55
default-run equivalents): 40 rounds instead of 120; β ∈ {0, 0.3, 0.5, 0.7, 0.9, 1} for FedDr+ (the
paper's grid without 0.1: 9 equivalents); participation 5, 10, 20 clients per round (50 cut: alone 5×
the work) and epochs 1, 3, 10 (2 and 5 cut), for FedDr+ and FedAvg only (FedBABU and SphereFed cut:
together they would add 17 equivalents). About 52 equivalents in all.

    FEDDR_DATA_DIR=../shared/data nohup python results/ch07_sensitivity.py &    # twice: one per core
    python results/ch07_sensitivity.py --status
    python results/ch07_sensitivity.py --collect-only
"""
import feddr_kit as fk
from _sweeps import LAYOUT, main

BASE = {**fk.sweep.TEACHING_SCALE, **LAYOUT, "rounds": 40, "eval_every": 40, "partition": "shard", "shards_per_client": 5}
METHODS = ["feddr+", "fedavg"]
# Each axis is its own setting (a sweep root), so the three grids are not multiplied together.
SETTINGS = {"beta": {}, "participation": {}, "epochs": {}}
GRIDS = {"beta": {"algorithm": ["feddr+"], "beta": [0.0, 0.3, 0.5, 0.7, 0.9, 1.0]},
         "participation": {"algorithm": METHODS, "clients_per_round": [5, 10, 20]},
         "epochs": {"algorithm": METHODS, "local_epochs": [1, 3, 10]}}
SEEDS = [0, 1, 2]  # the chapter's notebook reads these to know what a complete sweep holds

if __name__ == "__main__":
    main("ch07_sensitivity", SETTINGS, GRIDS, seeds=SEEDS, base=BASE, doc=__doc__)
