"""Chapter 06's sweep: base methods × regularizers (the paper's table of the synergy between base
methods and regularizers, ``tab:synergy_effect``) at the teaching scale (``fk.sweep.TEACHING_SCALE``:
``cnn_bn``, 120 rounds of 10 of 100 clients, 1 local epoch) on shard s = 5 CIFAR-10, three seeds, with
each base method's β-scaled control.

Every regularized run uses β = 0.9 (the paper's weight of the method's own loss) and the method's
default lr; ``dr`` with ``fd`` is FedDr+'s loss at DR's lr. A regularizer whose own gradient is small
acts as the base loss at a step scaled by β, so each base method also runs alone at ``lr · β``
(the "lr×β" settings): a regularizer's gain counts only if it also beats that control.

Budget cut, decided before any run: the paper's five base methods × six regularizer columns × three
seeds are 90 runs, about 5 hours of 2 CPU cores; the chapter's budget is 3. Kept: FedAvg (the
paper's base for every other regularizer) and DR (FedDr+'s base), all six columns, and their two
controls: 14 cells, 42 runs. Cut: FedBABU, SphereFed and FedETF (chapter 05 runs them alone).
Setting: s = 5, the teaching default (docs/teaching_scale.md), where chapters 00 and 07 also run;
the paper's table uses α = 0.1, which chapter 05 covers for the base methods. The global model is
evaluated only after the last round.

    FEDDR_DATA_DIR=../shared/data nohup python results/ch06_synergy.py &     # twice: one per core
    python results/ch06_synergy.py --status
    python results/ch06_synergy.py --collect-only
"""
import feddr_kit as fk
from feddr_kit.methods.base import initial_lr
from _sweeps import LAYOUT, main

BASE = {**fk.sweep.TEACHING_SCALE, **LAYOUT, "eval_every": fk.sweep.TEACHING_SCALE["rounds"], "beta": 0.9}
SHARD = {"partition": "shard", "shards_per_client": 5}
METHODS = ["fedavg", "dr"]
REGULARIZERS = ["none", "prox", "kd", "ntd", "ld", "fd"]
# The controls: each base method alone (no regularizer) at its default lr times β.
CONTROL_LR = {m: round(initial_lr(fk.Config(**{**BASE, **SHARD}, algorithm=m)) * BASE["beta"], 10) for m in METHODS}
SETTINGS = {"s=5": SHARD, **{f"s=5, {m} lr×β": {**SHARD, "algorithm": m, "regularizer": "none"} for m in METHODS}}
GRIDS = {"s=5": {"algorithm": METHODS, "regularizer": REGULARIZERS},
         **{f"s=5, {m} lr×β": {"lr": [CONTROL_LR[m]]} for m in METHODS}}
SEEDS = [0, 1, 2]  # the chapter's notebook reads these to know what a complete sweep holds

if __name__ == "__main__":
    main("ch06_synergy", SETTINGS, GRIDS, seeds=SEEDS, base=BASE, doc=__doc__)
