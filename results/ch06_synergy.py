"""Chapter 06's sweep: five base methods × six regularizers (the paper's Table 1) on Dirichlet
α = 0.1 CIFAR-10 at the results chapters' scale (``fk.sweep.SWEEP_SCALE``), two seeds.

Every run uses β = 0.9 (the paper's weight of the method's own loss) and the method's default lr;
``dr`` with ``fd`` is FedDr+. The global model is evaluated only after the last round. Two
processes, one per seed, take about 40 minutes on 2 idle CPU cores:

    FEDDR_DATA_DIR=../shared/data python results/ch06_synergy.py --seeds 0 &
    FEDDR_DATA_DIR=../shared/data python results/ch06_synergy.py --seeds 1
    python results/ch06_synergy.py --collect-only
"""
import feddr_kit as fk
from _sweeps import main

# Table 1 reports final accuracy only, so the global model is evaluated once, after the last round.
BASE = {**fk.sweep.SWEEP_SCALE, "eval_every": fk.sweep.SWEEP_SCALE["rounds"]}

SETTINGS = {"α=0.1": {"partition": "dirichlet", "alpha": 0.1}}
GRID = {"algorithm": ["fedavg", "fedbabu", "spherefed", "fedetf", "dr"],
        "regularizer": ["none", "prox", "kd", "ntd", "ld", "fd"]}
SEEDS = [0, 1]  # the chapter's notebook reads these to know what a complete sweep holds

if __name__ == "__main__":
    main("ch06_synergy", SETTINGS, GRID, seeds=SEEDS, base=BASE, doc=__doc__)
