"""Learning-rate grid at the teaching scale (the paper's appendix C did the same at full scale).

Runs each algorithm at each candidate lr with ``Config()`` defaults otherwise (real CIFAR-10, 100
clients, shard s=5, the ``cnn_bn`` model, 120 rounds: ``docs/teaching_scale.md``) and appends one row
per run to ``results/lr_grid.csv``; the runs themselves go to ``runs/lr_grid/``. The default lr of each
algorithm for the model (``default_lr`` in ``feddr_kit/methods/``) is the one with the best
``final_acc`` here. Points already in the CSV for the same model and scale are skipped, so an
interrupted grid continues where it stopped. When an algorithm's best lr is the largest of its grid,
the next point up is run too, with ``name=lr`` (10 after 3), until a larger lr does worse; a
default that moves takes a rerun of the chapters' rows run at the old one (``docs/teaching_scale.md``,
*Learning rates*). The ``cnn_bn`` rows were run when the default evaluated every 10 rounds
(evaluation changes no model: ``final_acc`` is the same at any ``eval_every``). The CSV also keeps
the rows that chose the earlier ``cnn``'s lrs (40 rounds, 2 local epochs, s=2).

    PYTHONPATH=. python results/lr_grid.py fedavg dr feddr+ spherefed fedetf    # one thread per process
    PYTHONPATH=. python results/lr_grid.py feddr+=3.0                            # one point
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import torch
from filelock import FileLock  # installed with torch

import feddr_kit as fk

CE_GRID = [0.02, 0.05, 0.1]
NORMALIZED_GRID = [0.1, 0.3, 1.0, 3.0]
# FedBABU, SCAFFOLD, FedNTD, FedExP and the personalized methods take FedAvg's lr, as in the
# reference code's configs.
GRIDS = {"fedavg": CE_GRID, "dr": NORMALIZED_GRID, "feddr+": NORMALIZED_GRID,
         "spherefed": NORMALIZED_GRID, "fedetf": CE_GRID}
OUT = Path(__file__).with_name("lr_grid.csv")
RUNS = Path(__file__).resolve().parent.parent / "runs" / "lr_grid"
KEY = ["algorithm", "lr", "seed", "model", "rounds", "local_epochs", "shards_per_client"]


def done(row: dict) -> bool:
    if not OUT.exists():
        return False
    table = pd.read_csv(OUT)
    return bool(((table[KEY] == pd.Series({k: row[k] for k in KEY})).all(axis=1)).any())


def run_in(folder: Path, cfg: fk.Config, data) -> dict:
    """Run ``cfg`` into ``folder`` (checkpointed every 10 rounds): a killed grid resumes its run there, and a
    finished run is read back."""
    if (folder / "summary.json").exists():
        return json.loads((folder / "summary.json").read_text())
    resume = (folder / "checkpoint.pt").exists()
    cfg = cfg.replace(out_dir=str(folder), overwrite=not resume, checkpoint_every=10)
    return fk.run(cfg, data=data, resume=resume).summary


def main(points: list[str], seed: int = 0) -> None:
    torch.set_num_threads(1)
    data = fk.data.load("cifar10")
    for item in points:  # "name" for its whole grid, or "name=lr" for one point
        algorithm, _, one = item.partition("=")
        for lr in [float(one)] if one else GRIDS[algorithm]:
            # channels_last: the committed grid's layout (NCHW), so a rerun reproduces it bit for bit
            cfg = fk.Config(algorithm=algorithm, lr=lr, seed=seed, progress=False, channels_last=False)
            row = {"algorithm": algorithm, "lr": lr, "seed": seed, "model": cfg.model, "rounds": cfg.rounds,
                   "local_epochs": cfg.local_epochs, "shards_per_client": cfg.shards_per_client}
            if done(row):
                continue
            folder = RUNS / f"{cfg.model}_{algorithm}_lr{lr:g}_seed{seed}"
            try:
                s = run_in(folder, cfg, data)
            except FloatingPointError as err:  # a diverged lr is a grid result too
                row.update(final_acc=float("nan"), best_acc=float("nan"), last5_acc=float("nan"),
                           sec_per_round=float("nan"), note=f"diverged: {err}".split(";")[0])
            else:
                row.update(final_acc=s["final_acc"], best_acc=s["best_acc"], last5_acc=s["last5_acc"],
                           sec_per_round=s["sec_per_round"], note="")
            print(row, flush=True)
            with FileLock(str(OUT) + ".lock"):  # several processes may run parts of the grid at once
                table = pd.read_csv(OUT) if OUT.exists() else pd.DataFrame()
                pd.concat([table, pd.DataFrame([row])], ignore_index=True).to_csv(OUT, index=False)


if __name__ == "__main__":
    main(sys.argv[1:] or list(GRIDS))
