"""The kit's CPU training round against the plain model's, per model and memory layout.

For each model (``--models``) and layout (NCHW, PyTorch's default, and channels-last NHWC):

- ``plain``: the model alone, trained the way a tutorial trains it: one ``build_model`` network, batches of
  the same real CIFAR-10 images gathered, augmented and normalized by ``ImageData.train_batch`` (the kit's
  own crop-and-flip), cross-entropy, ``torch.optim.SGD`` with the kit's momentum and weight decay. No
  clients, no aggregation, no evaluation.
- ``kit``: ``fk.run`` with FedAvg (the same cross-entropy arithmetic) at the drift probe's setting: 100
  shard clients, 10 a round, one local epoch, batch 50, the serial engine, ``channels_last`` as the layout.
  Its rounds' seconds come from the run's checkpoint: rounds 3 to R-1 (the first two warm up, the last
  evaluates).

Both count images per second of wall time, through the same number of images a round (10 clients × 500
images), best of ``--repeats``. The CSV (``results/cpu_step.csv``) keeps a row per machine × model ×
layout with both speeds, and the ratio per model that the target is stated in:
``kit_over_plain_best = (plain's best layout, images/s) / (kit's best layout, images/s)``: 1.0 means the
kit's round trains as fast as the plain model's best, 1.15 means 15 % slower. Rows of the same machine and
model are replaced; others are kept. Time it on an idle machine (nothing else running), one thread:

    FEDDR_DATA_DIR=../shared/data OMP_NUM_THREADS=1 python benchmarks/cpu_step.py
    FEDDR_DATA_DIR=../shared/data python benchmarks/cpu_step.py --threads 2 --models cnn_bn
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

import feddr_kit as fk
from round_time import kit_seconds  # this folder's script: the kit's timed rounds, read one way

CSV = Path(__file__).resolve().parents[1] / "results" / "cpu_step.csv"
LAYOUTS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}
SETTING = dict(dataset="cifar10", algorithm="fedavg", partition="shard", shards_per_client=2, num_clients=100,
               clients_per_round=10, local_epochs=1, batch_size=50, lr=0.01, engine="serial", device="cpu",
               probes=False, progress=False, seed=0)


def plain_images_per_second(model_name: str, layout: str, data: fk.data.ImageData, images: int, cfg: fk.Config) -> float:
    """Images/s of the plain training loop over ``images`` train images (``cfg``'s batch, momentum, weight decay)."""
    fmt = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(0)
    idx = torch.randperm(len(data.train_y), generator=gen)[:images]
    model = fk.models.build_model(model_name, data.num_classes).to(memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    start = time.perf_counter()
    for batch in idx.split(cfg.batch_size):
        x = data.train_batch(batch, gen).contiguous(memory_format=fmt)
        loss = F.cross_entropy(model(x), data.train_y[batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return images / (time.perf_counter() - start)


def kit_images_per_second(cfg: fk.Config, data: fk.data.ImageData, images: int) -> float:
    """Images/s of ``fk.run(cfg)``'s training rounds 3..R-1 (``round_time.kit_seconds``: round times from its checkpoint)."""
    return images / kit_seconds(cfg, data)


def measure(models: list[str], repeats: int, rounds: int) -> pd.DataFrame:
    """One row per model × layout: the plain and the kit's images/s (best of ``repeats``), and the model's ratio."""
    data = fk.data.load("cifar10")
    machine = fk.engine.device_name(torch.device("cpu"))
    rows = []
    for model in models:
        for layout in LAYOUTS:
            cfg = fk.Config(**SETTING, model=model, rounds=rounds, channels_last=layout == "nhwc")
            images = cfg.clients_per_round * (len(data.train_y) // cfg.num_clients)
            plain = max(plain_images_per_second(model, layout, data, images, cfg) for _ in range(repeats))
            kit = max(kit_images_per_second(cfg, data, images) for _ in range(repeats))
            rows.append(dict(machine=machine, model=model, layout=layout, plain_images_per_s=round(plain, 1),
                             kit_images_per_s=round(kit, 1)))
            print(f"{model:9s} {layout}: plain {plain:7.0f} images/s, kit {kit:7.0f} images/s", flush=True)
    table = pd.DataFrame(rows)
    best = table.groupby("model")[["plain_images_per_s", "kit_images_per_s"]].transform("max")
    table["kit_over_plain_best"] = (best["plain_images_per_s"] / best["kit_images_per_s"]).round(3)
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["cnn_nobn", "cnn_bn"])
    p.add_argument("--repeats", type=int, default=2, help="best of this many timings of each")
    p.add_argument("--rounds", type=int, default=5, help="kit rounds per timing (rounds 3..R-1 are counted; at least 4)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: OMP_NUM_THREADS or torch's own)")
    args = p.parse_args()
    if args.rounds < 4:
        p.error("--rounds must be at least 4: rounds 1-2 warm up and the last evaluates")
    if args.threads:
        torch.set_num_threads(args.threads)
    table = measure(args.models, args.repeats, args.rounds)
    if CSV.exists():
        old = fk.rundir.read_csv(CSV, "the benchmark's earlier rows")
        keep = ~(old["machine"].isin(table["machine"]) & old["model"].isin(table["model"]))
        table = pd.concat([old[keep], table], ignore_index=True)
    fk.rundir.write_text(CSV, table.to_csv(index=False))
    print(table.to_string(index=False))
    print(f"wrote {CSV}")


if __name__ == "__main__":
    main()
