"""ARCHIVED: the old-scale sweep (the `cnn`, 20 rounds of 5 clients) behind the CSVs beside it, kept as the
record of how they were made while the chapter's new-scale sweep (``results/ch06_synergy.py``) runs. It refuses to
run: its runs would land in the new sweep's folders.

Chapter 06's sweep: five base methods × six regularizers (the paper's Table 1) on shard s = 5
CIFAR-10 at the results chapters' scale (``fk.sweep.SWEEP_SCALE``), two seeds.

The paper's Table 1 uses Dirichlet α = 0.1. At this scale α = 0.1 leaves every base method but
FedETF at chance (chapter 05: FedAvg 10.9 %, DR 11.5 % over 3 seeds; the first 14 runs of this
sweep at α = 0.1 all ended at 10.0–12.6 %), so no regularizer's effect could show; s = 5 is the
chapter-05 setting where the base methods learn most (FedAvg 17 %, DR 23 %).

Every run uses β = 0.9 (the paper's weight of the method's own loss) and the method's default lr;
``dr`` with ``fd`` is FedDr+. The global model is evaluated only after the last round. Two
processes, one per seed, took 29 and 32 minutes on 2 CPU cores (measured, with other work on the machine):

    FEDDR_DATA_DIR=../shared/data python results/ch06_synergy.py --seeds 0 &
    FEDDR_DATA_DIR=../shared/data python results/ch06_synergy.py --seeds 1
    python results/ch06_synergy.py --collect-only
"""
import feddr_kit as fk
from _sweeps import main

# Table 1 reports final accuracy only, so the global model is evaluated once, after the last round.
BASE = {**fk.sweep.SWEEP_SCALE, "eval_every": fk.sweep.SWEEP_SCALE["rounds"]}

SETTINGS = {"s=5": {"partition": "shard", "shards_per_client": 5}}
GRID = {"algorithm": ["fedavg", "fedbabu", "spherefed", "fedetf", "dr"],
        "regularizer": ["none", "prox", "kd", "ntd", "ld", "fd"]}
SEEDS = [0, 1]  # the chapter's notebook reads these to know what a complete sweep holds

if __name__ == "__main__":
    raise SystemExit(f"{__file__} is archived; run results/ch06_synergy.py instead")
