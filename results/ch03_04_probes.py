"""Chapters 03 and 04 over several seeds: the probed federated runs (CE, DR, FedDr+ and FedDr+'s
β-scaled DR control), chapter 03's same-global-model experiment and chapter 04's β sweep (with the
control at every β), at the chapters' default parameters: the teaching scale (``cnn_bn``, 120 rounds
of 10 of 100 clients, 1 local epoch, shard s = 5), probed every 5 rounds.

    PYTHONPATH=. python results/ch03_04_probes.py            # seeds 0 1 2, one thread
    PYTHONPATH=. python results/ch03_04_probes.py --seeds 3 4 --threads 2
    PYTHONPATH=. python results/ch03_04_probes.py --seeds 2 --run "DR (dr)"   # only one federated run (in parallel)

Each federated run is saved in ``results/runs/ch03_04_probes/seed<k>/<run>/`` and each seed's tables in
``results/runs/ch03_04_probes/seed<k>/`` (finished runs and seeds are reused: kill and start again;
``--run`` trains one run so that several processes can share a seed; a seed's tables need its runs'
checkpoints, which git does not keep, so commit a seed once its ``done`` file exists). Every finished
seed is then collected into

* ``results/ch03_runs.csv``, ``results/ch04_runs.csv``: the runs' histories, one row per (run, seed, round);
* ``results/ch03_same_model.csv``: one row per (seed, shared lr, draw, loss, client);
* ``results/ch03_wipe.csv``: one row per (seed, s, lr fraction, loss, client): from the final DR global
  model, one local round by clients of an s = 2 and an s = 5 partition, CE (frozen ETF) and DR, each at
  a fraction of its own default lr (what sets how much of the unobserved classes a round wipes out);
* ``results/ch04_beta_sweep.csv``: one row per (seed, β, client);
* ``results/ch03_04_probes.json``: the settings, which the chapters compare with their parameters
  (a chapter run with other parameters reruns the seeds itself instead of loading these files);
* ``results/ch03_dr_model_seed2.pt`` and its ``.json`` (``fk.export``): seed 2's final DR global model,
  where chapter 03's drill-down starts (its default ``seed``), so that a fresh clone needs no training.

The settings below must stay equal to the defaults of the chapters' parameters cells.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import pandas as pd
import torch

import feddr_kit as fk
from feddr_kit import teaching

RESULTS = Path(__file__).resolve().parent
SETTINGS = {  # = the chapters' parameters cells
    "dataset": "cifar10", "model": "cnn_bn", "shards_per_client": 5, "rounds": 120, "local_epochs": 1,
    "lr_gamma": 0.1, "probe_samples": 500, "probe_every": 5, "beta": 0.9,
    # section 4 of chapter 03: each loss at its own lr (null), then one lr shared by every loss (CE's)
    "same_model_lrs": [None, 0.1], "same_model_draws": 2, "beta_grid": [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0],
    # chapter 03's wipe-out table: clients of these partitions, at these fractions of each loss's own lr
    "wipe_shards": [2, 5], "wipe_lr_fractions": [1.0, 0.3, 0.1, 0.01],
}
CONTROL = "DR lr×β (control)"
RUNS = {"CE (fedavg)": "fedavg", "DR (dr)": "dr", "FedDr+ (beta=0.9)": "feddr+", CONTROL: "dr"}
FOLDERS = {"CE (fedavg)": "ce", "DR (dr)": "dr", "FedDr+ (beta=0.9)": "feddrplus", CONTROL: "dr_beta_scaled"}
SAME = {"CE, head trained": "fedavg", "CE, frozen ETF": "fedbabu", "DR, frozen ETF": "dr"}
MODEL_SEED = 2  # the chapters' default `seed`: its final DR model is exported for chapter 03's drill-down
WIPE = {"CE, frozen ETF": "fedbabu", "DR, frozen ETF": "dr"}


def wipe_table(result, data, settings: dict = SETTINGS) -> pd.DataFrame:
    """From ``result``'s final global model (a DR run), one local round of the clients sampled after its
    last round, drawn from a shard partition with each ``wipe_shards`` value (same seed), for each loss
    of :data:`WIPE` at each ``wipe_lr_fractions`` of the loss's own default lr. Rows of
    :func:`feddr_kit.teaching.local_round_probes` with ``seed``, ``shards_per_client``, ``lr_fraction``, ``lr``."""
    from feddr_kit.methods.base import initial_lr

    cfg = result.config
    own = {name: initial_lr(cfg.replace(algorithm=name, regularizer=None, lr=None)) for name in WIPE.values()}
    frames = []
    for s in settings["wipe_shards"]:
        part = fk.federated.make_partition(cfg.replace(shards_per_client=s), data)
        for frac in settings["wipe_lr_fractions"]:
            lrs = {name: frac * lr for name, lr in own.items()}
            df = teaching.local_round_probes(result.model, data, part, WIPE, round=cfg.rounds,
                                             clients_per_round=cfg.clients_per_round, local_epochs=cfg.local_epochs,
                                             lr=lrs, probe_samples=settings["probe_samples"], seed=cfg.seed,
                                             model=cfg.model)
            frames.append(df.assign(seed=cfg.seed, shards_per_client=s, lr_fraction=frac,
                                    lr=df["algorithm"].map(lrs)))
    return pd.concat(frames, ignore_index=True)


def config(settings: dict = SETTINGS) -> fk.Config:
    """The federated runs' Config (evaluated and probed every ``probe_every`` rounds)."""
    return fk.Config(dataset=settings["dataset"], model=settings["model"], shards_per_client=settings["shards_per_client"],
                     rounds=settings["rounds"], local_epochs=settings["local_epochs"], lr_gamma=settings["lr_gamma"],
                     beta=settings["beta"], probes=True, probe_samples=settings["probe_samples"],
                     eval_every=settings["probe_every"], progress=False,
                     channels_last=False)  # the committed runs' layout (NCHW): a rerun reproduces them bit for bit


def run_config(label: str, seed: int, settings: dict = SETTINGS) -> fk.Config:
    """The Config of run ``label`` at ``seed``; the control is :func:`feddr_kit.beta_scaled_dr` of the FedDr+ run."""
    cfg = config(settings).replace(seed=seed)
    if label == CONTROL:
        return fk.beta_scaled_dr(cfg.replace(algorithm="feddr+"))
    return cfg.replace(algorithm=RUNS[label])


def federated_run(label: str, seed: int, root: Path, data, settings: dict = SETTINGS):
    """Run ``label`` at ``seed`` into ``root/seed<seed>/<label>/``, or load it from there when it finished."""
    folder = root / f"seed{seed}" / FOLDERS[label]
    cfg = run_config(label, seed, settings).replace(out_dir=str(folder), checkpoint_every=10)
    if (folder / "summary.json").exists():
        return fk.run(cfg, resume=True, data=data)
    return fk.run(cfg.replace(overwrite=True), data=data)


def one_seed(seed: int, data, root: Path, settings: dict = SETTINGS) -> dict[str, pd.DataFrame]:
    """Every table of one seed: ``runs`` (histories), ``same_model``, ``beta_sweep`` and ``wipe``."""
    done = {(label, seed): federated_run(label, seed, root, data, settings) for label in RUNS}
    histories, results = teaching.seed_runs(config(settings), RUNS, [seed], data, reuse=done)
    same = teaching.same_model_study(results[("DR (dr)", seed)], SAME, lrs=settings["same_model_lrs"],
                                     draws=settings["same_model_draws"], local_epochs=settings["local_epochs"],
                                     probe_samples=settings["probe_samples"])
    sweep = teaching.beta_sweep(results[("FedDr+ (beta=0.9)", seed)], settings["beta_grid"],
                                local_epochs=settings["local_epochs"], probe_samples=settings["probe_samples"], control=True)
    wipe = wipe_table(results[("DR (dr)", seed)], data, settings)
    return {"runs": histories, "same_model": same, "beta_sweep": sweep, "wipe": wipe}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--root", default=str(RESULTS / "runs" / "ch03_04_probes"))
    p.add_argument("--run", choices=list(RUNS), help="train only this federated run of each seed, then stop")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(args.root)
    data = fk.data.load(SETTINGS["dataset"])
    if args.run:
        for seed in args.seeds:
            federated_run(args.run, seed, root, data)
        return
    for seed in args.seeds:
        folder = root / f"seed{seed}"
        if (folder / "done").exists():
            continue
        start = time.time()
        tables = one_seed(seed, data, root)
        folder.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            df.to_csv(folder / f"{name}.csv", index=False)
        (folder / "done").write_text(f"{time.time() - start:.0f} s on {args.threads} thread(s), {platform.node()}\n")
        print(f"seed {seed}: {time.time() - start:.0f} s", flush=True)
    seeds = sorted(int(f.name[4:]) for f in root.glob("seed*") if (f / "done").exists())
    tables = {name: pd.concat([pd.read_csv(root / f"seed{s}" / f"{name}.csv") for s in seeds], ignore_index=True)
              for name in ("runs", "same_model", "beta_sweep", "wipe")}
    runs = tables["runs"]
    runs[runs["run"].isin(["CE (fedavg)", "DR (dr)"])].to_csv(RESULTS / "ch03_runs.csv", index=False)
    runs[runs["run"].isin(["DR (dr)", "FedDr+ (beta=0.9)", CONTROL])].to_csv(RESULTS / "ch04_runs.csv", index=False)
    tables["same_model"].to_csv(RESULTS / "ch03_same_model.csv", index=False)
    tables["beta_sweep"].to_csv(RESULTS / "ch04_beta_sweep.csv", index=False)
    tables["wipe"].to_csv(RESULTS / "ch03_wipe.csv", index=False)
    (RESULTS / "ch03_04_probes.json").write_text(json.dumps({"settings": SETTINGS, "seeds": seeds}, indent=1) + "\n")
    if (root / f"seed{MODEL_SEED}" / "dr" / "checkpoint.pt").exists():
        fk.export.export_model(root / f"seed{MODEL_SEED}" / "dr", RESULTS / f"ch03_dr_model_seed{MODEL_SEED}.pt")
    print(f"wrote results/ch03_*.csv, results/ch04_*.csv for seeds {seeds}")


if __name__ == "__main__":
    main()
