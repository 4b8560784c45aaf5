"""The teaching scale's frontier: accuracy, CPU time and FedDr+'s FD:DR gradient ratio of candidate models.

``docs/teaching_scale.md`` fixes four criteria before any candidate is measured (time, FedAvg accuracy,
the FD:DR ratio near the paper models', FedDr+'s cost) and reports what this script measured. All runs
are real CIFAR-10, 100 clients, 10 of them per round for one local epoch, batch 50, the paper's lr
schedule (×0.1 at 1/2 and 3/4 of the rounds), evaluated every 10 rounds. Stages:

* ``frontier``: every candidate at its round counts, seed 0: FedAvg on IID and on shard s = 5, and
  FedDr+ on s = 5 (its gradient ratios and feature norm). Runs share the machine, so their times are
  not used; the ``timing`` stage times each candidate alone.
* ``timing``: each candidate's FedAvg and FedDr+ for 10 rounds (2 of them evaluated) on 2 threads,
  ALONE on the machine (stop everything else first): seconds of a plain round, of an evaluated round
  and of the set-up, from which a whole run's seconds are estimated.
* ``confirm``: the chosen default, ``fk.Config()``, over seeds 0, 1, 2: FedDr+ (the default run) and
  FedAvg on the default partition, timed, run one at a time ALONE on the machine; and FedAvg on IID.

    PYTHONPATH=. python results/teaching_scale.py frontier [--only CANDIDATE ...]   # one thread per process
    PYTHONPATH=. python results/teaching_scale.py timing [--only CANDIDATE ...]      # alone, 2 threads
    PYTHONPATH=. python results/teaching_scale.py confirm [--iid-only | --timed-only]
    PYTHONPATH=. python results/teaching_scale.py collect                            # CSVs and the figure

Runs are kept in ``runs/teaching_scale/`` (kill and start again: finished runs are skipped); ``collect``
writes ``results/teaching_scale.csv`` (one row per run), ``results/teaching_scale_curves.csv`` (the
default runs' evaluated rounds) and ``docs/teaching_scale.png``; ``timing`` writes
``results/teaching_scale_timing.csv``.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

import feddr_kit as fk
from feddr_kit import models

RESULTS = Path(__file__).resolve().parent
ROOT = RESULTS.parent / "runs" / "teaching_scale"
# channels_last: the committed measurements' layout (NCHW), so that a rerun reproduces them bit for bit.
PROTOCOL = dict(dataset="cifar10", num_clients=100, clients_per_round=10, local_epochs=1, batch_size=50,
                eval_every=10, progress=False, channels_last=False)
# Learning rates. BatchNorm candidates: FedAvg 0.05 (best of 0.02 / 0.05 / 0.1 on IID, 60 rounds, for the
# 32-px and the space-to-depth models), FedDr+ 1.0 (best of 0.1 / 0.3 / 1.0 at s=5, 30 rounds, the
# space-to-depth model). cnn: FedAvg 0.03 (IID, 60 rounds: 44.7 %; the kit's 0.01 was chosen for 2 local
# epochs and gives 29 % at 40 rounds here), FedDr+ 0.03 (the kit's default, results/lr_grid.csv).
LRS = {"cnn": {"fedavg": 0.03, "feddr+": 0.03}, "bn": {"fedavg": 0.05, "feddr+": 1.0}}


def whitening(data: fk.data.ImageData, samples: int = 5000, eps: float = 1e-3) -> torch.Tensor:
    """ZCA whitening ``[12, 12]`` of the 2×2×3 patches of ``samples`` normalized training images (no labels)."""
    g = torch.Generator().manual_seed(0)
    x = data.normalize(data.train_x[torch.randperm(len(data.train_y), generator=g)[:samples]])
    patches = nn.functional.pixel_unshuffle(x, 2).permute(0, 2, 3, 1).reshape(-1, 12).double()
    eigenvalues, eigenvectors = torch.linalg.eigh(torch.cov(patches.T))
    return (eigenvectors @ torch.diag((eigenvalues + eps).rsqrt()) @ eigenvectors.T).float()


def register_candidates(data: fk.data.ImageData) -> None:
    """Add the candidates that are not kit models (each a variation of ``cnn_bn``'s body)."""
    if "cnn_bn_32px" in models.MODELS:
        return
    gap = models.GlobalAvgPool
    W = whitening(data)

    def whitened():
        stem = nn.Conv2d(12, 24, 1, bias=False)  # the whitened patch and its negative: ReLU keeps both signs
        with torch.no_grad():
            stem.weight.copy_(torch.cat([W, -W])[:, :, None, None])
        stem.weight.requires_grad_(False)  # frozen: computed once from the data, never trained
        return nn.Sequential(models.SpaceToDepth(), stem, nn.ReLU(), *models.conv_bn_stages(24, (48, 96, 192)), gap()), 192

    models.register("cnn_bn_32px", lambda: (nn.Sequential(*models.conv_bn_stages(3, (32, 64, 128)), gap()), 128), (8, None))
    models.register("cnn_bn_16px", lambda: (nn.Sequential(nn.AvgPool2d(2), *models.conv_bn_stages(3, (48, 96, 192)), gap()), 192),
                    (16, None))
    models.register("cnn_bn_whitened", whitened, (16, None))
    models.register("cnn_bn_pool_last", lambda: (nn.Sequential(models.SpaceToDepth(),
                                                               *models.conv_bn_stages(12, (48, 96, 192)), gap()), 192),
                    (16, None))
    models.register("cnn_bn_narrow", lambda: (nn.Sequential(models.SpaceToDepth(), *models.conv_bn_stages(12, (32, 64, 128)),
                                                            gap()), 128), (16, None))


# name -> (model, description, round counts)
CANDIDATES = {
    "cnn": ("cnn", "the earlier cnn (no normalization, d=128, 0.25 M), more rounds", (40, 120)),
    "cnn_bn_32px": ("cnn_bn_32px", "3 conv-BN-ReLU-pool stages at 32 px (32-64-128, d=128, 0.09 M)", (60,)),
    "cnn_bn_16px": ("cnn_bn_16px", "lower resolution: 2x2 average pooling to 16 px, then conv-BN-ReLU-pool 48-96-192 "
                    "(d=192)", (120,)),
    "cnn_bn_pool_last": ("cnn_bn_pool_last", "space-to-depth stem (16 px, lossless), conv-BN-ReLU-pool 48-96-192 "
                         "(d=192, 0.21 M)", (60, 120)),
    "cnn_bn_whitened": ("cnn_bn_whitened", "cnn_bn_pool_last behind a frozen ZCA-whitened 2x2-patch stem (label-free)",
                        (60, 120)),
    "cnn_bn_narrow": ("cnn_bn_narrow", "cnn_bn_pool_last at 32-64-128 (d=128, 0.10 M)", (120,)),
    "cnn_bn": ("cnn_bn", "the kit's cnn_bn: cnn_bn_pool_last with each stage's pooling before BN and ReLU "
               "(airbench's order)", (120,)),
}
ARMS = {  # label -> (algorithm, partition overrides)
    "fedavg iid": ("fedavg", dict(partition="iid")),
    "fedavg s=5": ("fedavg", dict(partition="shard", shards_per_client=5)),
    "feddr+ s=5": ("feddr+", dict(partition="shard", shards_per_client=5)),
}


def candidate_config(candidate: str, rounds: int, arm: str, seed: int = 0) -> fk.Config:
    model = CANDIDATES[candidate][0]
    algorithm, partition = ARMS[arm]
    lr = LRS["cnn" if model == "cnn" else "bn"][algorithm]
    return fk.Config(**PROTOCOL, **partition, model=model, algorithm=algorithm, rounds=rounds, lr=lr, seed=seed)


def run_once(cfg: fk.Config, folder: Path, data) -> dict:
    """Run ``cfg`` into ``folder`` unless it finished there; returns its summary and history."""
    if not (folder / "summary.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        fk.run(cfg.replace(out_dir=str(folder), overwrite=True, checkpoint_every=0), data=data)
    return json.loads((folder / "summary.json").read_text())


def frontier(data, only: list[str]) -> None:
    torch.set_num_threads(1)
    for candidate, (_, _, rounds_list) in CANDIDATES.items():
        if only and candidate not in only:
            continue
        for rounds in rounds_list:
            for arm in ARMS:
                folder = ROOT / "frontier" / candidate / f"r{rounds}" / arm.replace(" ", "_").replace("=", "")
                t = time.time()
                s = run_once(candidate_config(candidate, rounds, arm), folder, data)
                print(f"{candidate} r{rounds} {arm}: {100 * s['final_acc']:.2f} % ({time.time() - t:.0f} s)", flush=True)


def timing(data, only: list[str]) -> None:
    """Each candidate's rounds timed alone on 2 threads (10 rounds, evaluated at 5 and 10); ``only`` retimes
    those candidates and keeps the others' rows."""
    torch.set_num_threads(2)
    out = RESULTS / "teaching_scale_timing.csv"
    kept = pd.read_csv(out) if out.exists() else pd.DataFrame(columns=["candidate"])
    kept = kept[kept.candidate.isin(CANDIDATES) & ~kept.candidate.isin(only or list(CANDIDATES))]
    rows = []
    for candidate in CANDIDATES:
        if only and candidate not in only:
            continue
        for arm in ("fedavg s=5", "feddr+ s=5"):
            cfg = candidate_config(candidate, 10, arm).replace(eval_every=5)
            t0 = time.perf_counter()
            result = fk.run(cfg, data=data)
            total = time.perf_counter() - t0
            seconds = result.history["seconds"].to_numpy()
            round_total = result.summary["total_seconds"]
            plain = (round_total - seconds.sum()) / 8  # the 8 rounds that were not evaluated
            rows.append(dict(candidate=candidate, algorithm=ARMS[arm][0], plain_round_s=plain,
                             evaluated_round_s=float(seconds.mean()), setup_s=total - round_total,
                             threads=2, machine=platform.processor() or platform.machine()))
            print(rows[-1], flush=True)
            order = list(CANDIDATES)
            table = pd.concat([kept, pd.DataFrame(rows)], ignore_index=True)
            table.sort_values("candidate", key=lambda c: c.map(order.index), kind="stable").to_csv(out, index=False)


def estimated_seconds(timing_row: pd.Series, rounds: int, eval_every: int = 10) -> float:
    """A whole run's seconds from :func:`timing`'s per-round figures."""
    evaluated = len([t for t in range(rounds) if (t + 1) % eval_every == 0 or t == rounds - 1])
    return timing_row.setup_s + (rounds - evaluated) * timing_row.plain_round_s + evaluated * timing_row.evaluated_round_s


def confirm(data, seeds: list[int], iid: bool, timed: bool) -> None:
    """The default's criteria over seeds: the timed runs (FedDr+ and FedAvg, 2 threads, alone) and FedAvg IID."""
    for seed in seeds:
        default = fk.Config(seed=seed, progress=False, channels_last=False)  # the layout the committed runs used
        arms = {}
        if timed:
            arms.update({"default feddr+": default, "default fedavg": default.replace(algorithm="fedavg")})
        if iid:
            arms["fedavg iid"] = default.replace(algorithm="fedavg", partition="iid")
        for label, cfg in arms.items():
            folder = ROOT / "confirm" / f"seed{seed}" / label.replace(" ", "_").replace("+", "plus")
            torch.set_num_threads(2 if label.startswith("default") else 1)
            t0 = time.perf_counter()
            fresh = not (folder / "summary.json").exists()
            s = run_once(cfg, folder, data)
            if fresh:  # wall time of the whole call, set-up included, as a student would see it
                (folder / "wall_seconds.json").write_text(json.dumps({"wall_seconds": time.perf_counter() - t0,
                                                                      "threads": torch.get_num_threads()}))
            print(f"seed {seed} {label}: {100 * s['final_acc']:.2f} %", flush=True)


def summarize_history(folder: Path) -> dict:
    h = pd.read_csv(folder / "history.csv")
    out = {"feature_norm_final": float(h["feature_norm"].iloc[-1])}
    if "grad_ratio_features" in h:
        full_lr = h[h["lr"] == h["lr"].max()]
        for col in ("grad_ratio_features", "grad_ratio_body"):
            out[f"{col}_full_lr"] = float(full_lr[col].mean())
            out[f"{col}_run"] = float(h[col].mean())
    return out


def collect() -> None:
    rows = []
    timing_table = pd.read_csv(RESULTS / "teaching_scale_timing.csv") if (RESULTS / "teaching_scale_timing.csv").exists() else None
    for candidate, (model, description, rounds_list) in CANDIDATES.items():
        for rounds in rounds_list:
            for arm, (algorithm, _) in ARMS.items():
                folder = ROOT / "frontier" / candidate / f"r{rounds}" / arm.replace(" ", "_").replace("=", "")
                if not (folder / "summary.json").exists():
                    continue
                s = json.loads((folder / "summary.json").read_text())
                cfg = json.loads((folder / "config.json").read_text())
                row = dict(stage="frontier", candidate=candidate, description=description, model=model, rounds=rounds,
                           arm=arm, algorithm=algorithm, seed=0, lr=s["lr0"], final_acc=s["final_acc"],
                           partition=cfg["partition"], shards_per_client=cfg["shards_per_client"],
                           **summarize_history(folder))
                if timing_table is not None:
                    t = timing_table[(timing_table.candidate == candidate) & (timing_table.algorithm == algorithm)]
                    if len(t) and arm != "fedavg iid":
                        row["estimated_seconds_2_idle_cores"] = estimated_seconds(t.iloc[0], rounds)
                rows.append(row)
    for folder in sorted((ROOT / "confirm").glob("seed*/*")):
        if not (folder / "summary.json").exists():
            continue
        s = json.loads((folder / "summary.json").read_text())
        cfg = json.loads((folder / "config.json").read_text())
        wall = folder / "wall_seconds.json"
        rows.append(dict(stage="confirm", candidate=cfg["model"], description="fk.Config() (the teaching default)",
                         model=cfg["model"], rounds=cfg["rounds"], arm=folder.name.replace("_", " ").replace("plus", "+"),
                         algorithm=cfg["algorithm"], seed=cfg["seed"], lr=s["lr0"], final_acc=s["final_acc"],
                         partition=cfg["partition"], shards_per_client=cfg["shards_per_client"],
                         run_seconds_2_idle_cores=json.loads(wall.read_text())["wall_seconds"]
                         if wall.exists() and folder.name.startswith("default") else np.nan,
                         **summarize_history(folder)))
    table = pd.DataFrame(rows)
    table.to_csv(RESULTS / "teaching_scale.csv", index=False)
    print(table.drop(columns=["description"]).to_string(index=False))
    curves = [pd.read_csv(folder / "history.csv").assign(arm=folder.name.replace("_", " ").replace("plus", "+"),
                                                          seed=int(folder.parent.name.removeprefix("seed")))
              for folder in sorted((ROOT / "confirm").glob("seed*/*")) if (folder / "summary.json").exists()]
    if curves:  # the default runs' evaluated rounds, for chapter 00 and the figure
        keep = ["arm", "seed", "round", "lr", "test_acc", "feature_norm", "grad_ratio_features", "grad_ratio_body"]
        pd.concat(curves, ignore_index=True).reindex(columns=keep).to_csv(RESULTS / "teaching_scale_curves.csv", index=False)
    figure(table)


def figure(table: pd.DataFrame) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = table[table.stage == "frontier"]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.4))
    for candidate, group in front.groupby("candidate", sort=False):
        drplus = group[group.arm == "feddr+ s=5"].set_index("rounds")
        for ax, arm in zip(axes, ("fedavg iid", "fedavg s=5")):
            g = group[group.arm == arm].set_index("rounds")
            x = drplus["estimated_seconds_2_idle_cores"].reindex(g.index) / 60 if "estimated_seconds_2_idle_cores" in drplus else None
            if x is None or x.isna().all():
                continue
            ax.plot(x, 100 * g["final_acc"], "o-", label=candidate)
            for r, xx, yy in zip(g.index, x, 100 * g["final_acc"]):
                ax.annotate(f"{r} rds", (xx, yy), textcoords="offset points", xytext=(4, -10), fontsize=7)
    for ax, arm, target in zip(axes, ("IID", "shard s=5"), (65, 50)):
        ax.axhline(target, color="grey", ls="--", lw=1)
        ax.axvline(4, color="grey", ls=":", lw=1)
        ax.set(xlabel="estimated FedDr+ run time on 2 idle cores (min)", ylabel=f"FedAvg final accuracy, {arm} (%)",
               title=f"FedAvg on CIFAR-10 {arm} (target {target} %, 4 min)")
    axes[1].legend(loc="lower right", fontsize=8)
    # FD:DR gradient ratio (features) at full lr, against the band within 3x of MobileNet's (criterion 3)
    regime = pd.read_csv(RESULTS / "paper_regime_cpu.csv")
    mobilenet = regime[regime.model == "mobilenet"]["grad_ratio_features"].mean()
    vgg = regime[regime.model == "vgg11"]["grad_ratio_features"].mean()
    drplus = front[front.arm == "feddr+ s=5"].groupby("candidate", sort=False)["grad_ratio_features_full_lr"].mean()
    ax = axes[2]
    ax.barh(drplus.index, drplus.to_numpy(), color="tab:blue")
    ax.axvspan(mobilenet / 3, 3 * mobilenet, color="tab:green", alpha=0.15, label="within 3x of MobileNet")
    ax.axvline(mobilenet, color="tab:green", lw=1.5, label=f"MobileNet (lr 5, CPU rounds): {mobilenet:.3f}")
    ax.axvline(vgg, color="tab:orange", lw=1.5, ls="--", label=f"VGG-11 (lr 0.35, CPU rounds): {vgg:.3f}")
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set(xlabel="FedDr+ ‖∇(1-β)L_FD‖ / ‖∇β L_DR‖ w.r.t. features, full-lr rounds (log)",
           title="Is distillation alive? FD:DR gradient ratio, s=5")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, ncol=2)  # below: bars fill the panel
    fig.tight_layout()
    fig.savefig(RESULTS.parent / "docs" / "teaching_scale.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("stage", choices=("frontier", "timing", "confirm", "collect"))
    p.add_argument("--only", nargs="*", default=[], choices=list(CANDIDATES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--iid-only", action="store_true")
    p.add_argument("--timed-only", action="store_true")
    args = p.parse_args()
    if args.stage == "collect":
        collect()
        return
    data = fk.data.load("cifar10")
    register_candidates(data)
    if args.stage == "frontier":
        frontier(data, args.only)
    elif args.stage == "timing":
        timing(data, args.only)
    else:
        confirm(data, args.seeds, iid=not args.timed_only, timed=not args.iid_only)


if __name__ == "__main__":
    main()
