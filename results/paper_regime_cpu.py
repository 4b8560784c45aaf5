"""The paper's feature regime, measured on a CPU: FedDr+ with the paper's own models and learning rates.

FedDr+ distils features with ``(1-β)·L_FD`` next to ``β·L_DR``. How much the FD term pulls depends
on the model's feature scale, so the teaching scale must be compared with the regime the paper's own
models put FedDr+ in. This script runs FedDr+ on real CIFAR-10 with the paper's models,

* VGG-11 (no BatchNorm, d = 512) at the paper's CIFAR-10 setting: lr 0.35, E = 10 local epochs;
* MobileNet (BatchNorm on batch statistics, d = 1024) at the paper's MobileNet setting: lr 5.0, E = 3
  (the paper ran it on CIFAR-100; here it is CIFAR-10),

at shard s = 2 and s = 5, with as many rounds and clients as a CPU allows (a few rounds of 2-3 of the
100 clients, from the random initialisation). The lr is held constant, as in the paper's first 160
rounds. Every round is evaluated, so each history row carries the gradient ratios
``grad_ratio_features`` / ``grad_ratio_body`` (``‖∇(1-β)L_FD‖ / ‖∇β·L_DR‖``, the mean over the round's
local steps) and the global model's ``feature_norm``. The paper's 320 rounds are out of reach here;
``docs/teaching_scale.md`` says what these first rounds bound.

    PYTHONPATH=. python results/paper_regime_cpu.py                    # every setting, one thread each
    PYTHONPATH=. python results/paper_regime_cpu.py --settings vgg11-s2 --threads 2

Runs are saved in ``runs/paper_regime_cpu/<setting>/`` with a checkpoint after every round (kill and
start again: it resumes), and every finished round is collected into ``results/paper_regime_cpu.csv``.
"""
from __future__ import annotations

import argparse
import platform
from pathlib import Path

import pandas as pd
import torch

import feddr_kit as fk

RESULTS = Path(__file__).resolve().parent
PAPER = {  # the paper's FedDr+ settings of each model (appendix C; spec §1.6)
    "vgg11": dict(model="vgg11", lr=0.35, local_epochs=10),
    "mobilenet": dict(model="mobilenet", lr=5.0, local_epochs=3),
}
SETTINGS = {
    f"{model}-s{s}": dict(PAPER[model], shards_per_client=s, clients_per_round=clients, rounds=rounds)
    for model, clients, rounds in (("vgg11", 2, 3), ("mobilenet", 3, 5)) for s in (2, 5)
}
BASE = dict(dataset="cifar10", algorithm="feddr+", partition="shard", num_clients=100, lr_decay_at=(),
            eval_every=1, checkpoint_every=1, seed=0, progress=True,
            channels_last=False)  # the committed runs' layout (NCHW): a rerun reproduces them bit for bit


def collect(root: Path) -> pd.DataFrame:
    """Every saved round of every setting under ``root`` as one frame (one row per setting and round)."""
    frames = []
    for name, settings in SETTINGS.items():
        path = root / name / "history.csv"
        if path.exists():
            h = pd.read_csv(path)
            frames.append(h.assign(setting=name, model=settings["model"], shards_per_client=settings["shards_per_client"],
                                   lr0=settings["lr"], local_epochs=settings["local_epochs"],
                                   clients_per_round=settings["clients_per_round"]))
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    first = ["setting", "model", "shards_per_client", "lr0", "local_epochs", "clients_per_round", "round"]
    return out[first + [c for c in out.columns if c not in first]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--root", default=str(RESULTS.parent / "runs" / "paper_regime_cpu"))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(args.root)
    data = fk.data.load("cifar10")
    for name in args.settings:
        cfg = fk.Config(**{**BASE, **SETTINGS[name]}, out_dir=str(root / name))
        done = (root / name / "summary.json").exists()
        if not done:
            resume = (root / name / fk.federated.CHECKPOINT).exists()
            print(f"{name}: {'resuming' if resume else 'starting'} ({platform.processor() or platform.machine()}, "
                  f"{args.threads} thread(s))", flush=True)
            fk.run(cfg, resume=resume, data=data)
        table = collect(root)
        table.to_csv(RESULTS / "paper_regime_cpu.csv", index=False)
        print(table[table.setting == name][["round", "test_acc", "feature_norm", "grad_ratio_features",
                                            "grad_ratio_body", "seconds"]].to_string(index=False), flush=True)


if __name__ == "__main__":
    main()
