"""The FedDr+ paper's published numbers that the results chapters (05-07) set beside the kit's.

Transcribed from ``paper/feddr-plus-paper.tex`` (``tests/test_sweep.py`` checks every number against
the LaTeX source when it is present). Accuracies in percent, as printed; a cell the paper marks
*(Failed)* is NaN. Algorithm names are the kit's registry names (``fk.algorithms.algorithm_names()``).

- :func:`table3`: Table 3, VGG-11 on CIFAR-10 (global accuracy, mean and std over three seeds,
  320 rounds, 10 local epochs, 10 of 100 clients per round; one RTX 3090).
- :func:`table1`: Table 1, MobileNet on CIFAR-100 (base method x regularizer, one number per cell).
- :func:`table7`: Table 7, seconds per round on CIFAR-100 (s = 10), MobileNet, one NVIDIA A5000.
"""
from __future__ import annotations

import math

import pandas as pd

from .errors import FeddrKitError

NAN = math.nan
# Table 3 (tab:gfl_acc_all), the "VGG on CIFAR-10" columns of both blocks: (mean, std) per column.
_TABLE3_COLUMNS = ("s=2", "s=5", "s=10", "α=0.1", "α=0.2", "α=0.3")
_TABLE3 = {
    "fedavg":    [(72.08, 0.67), (81.53, 0.35), (82.38, 0.40), (68.71, 1.82), (77.75, 0.26), (80.76, 0.51)],
    "scaffold":  [(75.49, 0.42), (84.14, 0.13), (85.11, 0.29), (NAN, NAN), (80.15, 0.29), (82.63, 0.23)],
    "fedntd":    [(72.21, 0.59), (69.96, 17.10), (81.99, 0.42), (70.22, 0.40), (77.16, 0.20), (79.50, 0.56)],
    "fedexp":    [(72.31, 0.60), (81.41, 0.19), (82.47, 0.16), (70.14, 0.53), (78.09, 0.21), (80.40, 0.54)],
    "fedbabu":   [(71.99, 0.52), (81.07, 0.60), (82.32, 0.06), (65.15, 3.66), (77.03, 0.25), (79.91, 0.13)],
    "spherefed": [(76.33, 0.33), (83.67, 0.18), (84.36, 0.30), (67.49, 3.49), (80.05, 0.40), (82.62, 0.66)],
    "fedetf":    [(67.81, 0.94), (80.78, 0.68), (82.60, 0.46), (70.75, 0.36), (77.86, 0.46), (79.95, 0.34)],
    "feddr+":    [(76.57, 0.51), (83.22, 0.34), (84.14, 0.27), (72.07, 2.26), (80.90, 0.02), (82.42, 0.10)],
}
# Table 1 (tab:synergy_effect): rows are base methods ("dr" is the paper's "Dot-Regression"), columns
# the regularizers ("none" is the paper's "Baseline"); two blocks, sharding s=10 and LDA alpha=0.1.
_REGULARIZERS = ("none", "prox", "kd", "ntd", "ld", "fd")
_TABLE1 = {
    "s=10": {
        "fedavg":    (37.22, 30.27, 35.14, 35.56, 34.83, 37.82),
        "fedbabu":   (46.20, 36.71, 45.50, 45.09, 45.81, 45.31),
        "spherefed": (43.90, 1.36, 41.01, 43.47, 41.73, 45.21),
        "fedetf":    (32.42, 25.18, 32.76, 31.98, 32.25, 32.77),
        "dr":        (42.52, 5.42, 46.60, 45.78, 47.52, 48.69),
    },
    "α=0.1": {
        "fedavg":    (42.52, 36.09, 41.48, 41.34, 43.36, 43.10),
        "fedbabu":   (47.37, 39.04, 45.58, 45.56, 46.46, 44.77),
        "spherefed": (46.98, 1.46, 45.22, 46.25, 43.84, 48.61),
        "fedetf":    (46.27, 34.92, 44.94, 45.77, 44.36, 45.92),
        "dr":        (42.72, 7.47, 48.19, 33.08, 49.09, 50.79),
    },
}
# Table 7 (apptab:elapsed_time): seconds per communication round.
_TABLE7 = {"fedavg": 21.3, "fedbabu": 20.9, "scaffold": 22.3, "fedntd": 22.9, "fedexp": 20.3,
           "fedetf": 22.2, "spherefed": 22.3, "feddr+": 24.4}


def table3(columns: tuple[str, ...] | list[str] | None = None) -> pd.DataFrame:
    """Table 3, VGG-11 on CIFAR-10: a frame indexed by (algorithm, stat) with stat ``mean`` / ``std``
    and one column per setting (``"s=2"``, ``"s=5"``, ``"s=10"``, ``"α=0.1"``, ``"α=0.2"``,
    ``"α=0.3"``), in percent; NaN where the paper reports a failed run (SCAFFOLD at α = 0.1).
    ``columns`` picks a subset, in that order. Eight algorithms (``dr`` is not in Table 3)."""
    cols = list(_TABLE3_COLUMNS if columns is None else columns)
    bad = [c for c in cols if c not in _TABLE3_COLUMNS]
    if bad:
        raise FeddrKitError(f"columns: {bad} not in Table 3's CIFAR-10 columns {list(_TABLE3_COLUMNS)}")
    rows = {}
    for algo, cells in _TABLE3.items():
        by = dict(zip(_TABLE3_COLUMNS, cells))
        rows[(algo, "mean")] = [by[c][0] for c in cols]
        rows[(algo, "std")] = [by[c][1] for c in cols]
    df = pd.DataFrame.from_dict(rows, orient="index", columns=cols)
    df.index = pd.MultiIndex.from_tuples(df.index, names=["algorithm", "stat"])
    return df


def table1(setting: str = "α=0.1") -> pd.DataFrame:
    """Table 1, MobileNet on CIFAR-100, one block (``"α=0.1"`` or ``"s=10"``): rows the base methods
    (fedavg, fedbabu, spherefed, fedetf, dr), columns the regularizers (none, prox, kd, ntd, ld, fd),
    accuracy in percent (one number per cell; the paper gives no spread)."""
    if setting not in _TABLE1:
        raise FeddrKitError(f"setting must be one of {list(_TABLE1)}, got {setting!r}")
    return pd.DataFrame.from_dict(_TABLE1[setting], orient="index", columns=list(_REGULARIZERS)).rename_axis(
        index="algorithm", columns="regularizer")


def table7() -> pd.Series:
    """Table 7: seconds per round of eight algorithms (CIFAR-100, s = 10, MobileNet, one A5000 GPU), by
    algorithm name (``dr`` is not in the table)."""
    return pd.Series(_TABLE7, name="paper sec/round").rename_axis("algorithm")
