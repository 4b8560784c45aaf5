"""Seconds per training round of the drift probe's runs on this machine, under one condition.

The probe (``results/drift_probe.py``) runs for many machine-hours, so how it runs (threads per process,
processes side by side) is chosen by measurement. This script times each (model, E) cell's FedAvg and
FedDr+ with the probe's own config (real CIFAR-10, s = 2, 10 clients a round, batch 50, probes on), for a
few rounds, and appends one row per run to ``results/drift_probe_timing.csv``: the machine, the
condition (a label the caller gives: "alone", "beside another process", ...), the torch threads, the
cell, the method, the lr, how many training rounds were timed and their mean seconds. The last round of
each timed run evaluates and is not counted; neither is anything before the first round (data, model).

lrs: each grid's centre (FedAvg 0.1, FedDr+ 3), except where the probe's finished grid runs diverged at
it (``cnn_nobn``: FedAvg 0.03, FedDr+ 1), since a diverged round stops the run; speed does not depend
on the lr.

    # idle machine, one process:
    FEDDR_DATA_DIR=../shared/data python benchmarks/drift_probe_timing.py --condition alone --threads 1
    # two side by side:
    for m in fedavg feddr+; do python benchmarks/drift_probe_timing.py --condition "beside another" \
        --cells cnn_nobn:1 --methods $m & done; wait
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from filelock import FileLock

import feddr_kit as fk

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "results" / "drift_probe_timing.csv"
TIMING_LR = {("cnn_nobn", "fedavg"): 0.03, ("cnn_nobn", "feddr+"): 1.0}


def probe_module():
    """``results/drift_probe.py`` as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("drift_probe", REPO / "results" / "drift_probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def cpu_model() -> str:
    """The processor's name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def round_seconds(cfg: fk.Config, data) -> list[float]:
    """Wall seconds of each training round of ``fk.run(cfg)`` but the last (which evaluates)."""
    with tempfile.TemporaryDirectory() as out:
        fk.run(cfg, data=data, out_dir=out, checkpoint_every=0, eval_every=cfg.rounds)
        seconds = torch.load(Path(out) / "checkpoint.pt", weights_only=False)["round_seconds"]
    return seconds[:-1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--condition", required=True, help="what else ran beside this process, in words")
    p.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    p.add_argument("--cells", default="cnn_bn:1,cnn_nobn:1,cnn_nobn:5,cnn_bn:5", help="model:E,...")
    p.add_argument("--methods", default="fedavg,feddr+")
    p.add_argument("--rounds", type=int, default=3, help="rounds per run; all but the last are timed")
    args = p.parse_args(argv)
    if args.rounds < 2:
        raise SystemExit("drift_probe_timing: --rounds must be at least 2 (the last round evaluates)")
    torch.set_num_threads(args.threads)
    probe = probe_module()
    data = fk.data.load("cifar10")
    machine = f"{platform.machine()} {os.cpu_count()} cores, {cpu_model()}"
    for cell in args.cells.split(","):
        model, epochs = cell.split(":")
        for method in args.methods.split(","):
            lr = TIMING_LR.get((model, method), probe.CENTRE[method])
            cfg = probe.Item(model, int(epochs), method, lr, 1).config().replace(rounds=args.rounds)
            seconds = round_seconds(cfg, data)
            row = {"measured_on": datetime.date.today().isoformat(), "machine": machine,
                   "condition": args.condition, "threads": args.threads, "model": model,
                   "local_epochs": int(epochs), "method": method, "lr": lr, "rounds_timed": len(seconds),
                   "sec_per_round": round(statistics.mean(seconds), 2),
                   "round_seconds": " ".join(f"{s:.1f}" for s in seconds)}
            print(f"{time.strftime('%H:%M:%S')} {row}", flush=True)
            with FileLock(str(OUT) + ".lock"):
                old = pd.read_csv(OUT) if OUT.exists() else pd.DataFrame()
                fk.rundir.write_text(OUT, pd.concat([old, pd.DataFrame([row])], ignore_index=True).to_csv(index=False))


if __name__ == "__main__":
    main()
