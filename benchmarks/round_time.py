"""Seconds per round: the kit's serial and batched engines against a typical-FL-code reference.

For each model × algorithm (fedavg, feddr+) × engine:

- ``serial`` / ``batched``: ``fk.run`` with ``Config.engine`` set (evaluation only at the last round);
- ``dataloader``: the way the surveyed FL libraries write a round, here in this script: per client a
  ``copy.deepcopy`` of the global model (and of the teacher for FedDr+), a ``torch.utils.data.DataLoader``
  over the client's ``Subset`` of a CPU ``TensorDataset`` with torchvision transforms per image
  (RandomCrop(32, padding=4), RandomHorizontalFlip, Normalize), ``.to(device)`` per batch,
  ``torch.optim.SGD``, then a size-weighted average of the state dicts.

All run in one process on the same synthetic data (CIFAR shapes; speed does not depend on pixel
values), the same partition and the same sampled clients. Rounds 1-2 are warm-up and not counted;
the last round of an ``fk.run`` (which evaluates) is not counted either, so ``--rounds`` must be ≥ 4.
Writes ``results/round_time_<device>.csv`` (columns device, model, algorithm, engine, sec_per_round),
replacing rows with the same device/model/algorithm/engine and keeping the others.

    python benchmarks/round_time.py --models cnn --rounds 4 --train-per-class 200      # CPU, small
    python benchmarks/round_time.py --models vgg11 --train-per-class 5000 --test-per-class 1000 --epochs 10
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision import transforms

import feddr_kit as fk
from feddr_kit.algorithms import get_algorithm
from feddr_kit.federated import lr_at, make_partition, resolve_device, sample_clients

ENGINES = ("serial", "batched", "dataloader")


device_name = fk.engine.device_name  # ``torch.cuda.get_device_name()`` on CUDA, ``"cpu (N cores, T threads)"`` on CPU


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kit_seconds(cfg: fk.Config, data: fk.data.ImageData) -> float:
    """Mean wall seconds of rounds 3..R-1 of ``fk.run(cfg)`` (round times read from its checkpoint)."""
    with tempfile.TemporaryDirectory() as out:
        fk.run(cfg, data=data, out_dir=out, checkpoint_every=0, eval_every=cfg.rounds)
        seconds = torch.load(Path(out) / "checkpoint.pt", weights_only=False)["round_seconds"]
    counted = seconds[2:-1]
    return sum(counted) / len(counted)


class ImageTensors(Dataset):
    """uint8 images ``[N,3,H,W]`` and labels on the CPU, one image at a time through ``transform``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, transform):
        self.x, self.y, self.transform = x, y, transform

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.transform(self.x[i].float().div(255.0)), self.y[i]


def dataloader_seconds(cfg: fk.Config, data: fk.data.ImageData, device: torch.device) -> float:
    """Mean wall seconds of rounds 3..R of the typical-FL-code reference (no evaluation)."""
    cpu = data.to("cpu") if hasattr(data, "to") else data
    part = make_partition(cfg, cpu)
    transform = transforms.Compose([
        transforms.RandomCrop(cpu.train_x.shape[-1], padding=4),
        transforms.RandomHorizontalFlip(),
        transforms.Normalize(cpu.mean.tolist(), cpu.std.tolist()),
    ])
    dataset = ImageTensors(cpu.train_x, cpu.train_y, transform)
    torch.manual_seed(cfg.seed)
    algo = get_algorithm(cfg)
    global_model = fk.models.build_model(cfg.model, cpu.num_classes)
    algo.setup(global_model, cfg.seed)  # FedDr+'s frozen ETF head
    global_model.to(device)
    lr0 = cfg.lr if cfg.lr is not None else algo.initial_lr(cfg.model)
    seconds = []
    for t in range(cfg.rounds):
        sync(device)
        t0 = time.perf_counter()
        clients = sample_clients(cfg.seed, t, cfg.num_clients, cfg.clients_per_round)
        states, sizes = [], []
        for k in clients.tolist():
            local = copy.deepcopy(global_model).train()
            teacher = copy.deepcopy(global_model).eval() if cfg.algorithm == "feddr+" else None
            opt = torch.optim.SGD([p for p in local.parameters() if p.requires_grad], lr=lr_at(cfg, lr0, t),
                                  momentum=cfg.momentum, weight_decay=cfg.weight_decay)
            loader = DataLoader(Subset(dataset, part.train_indices[k].tolist()), batch_size=cfg.batch_size, shuffle=True)
            for _ in range(cfg.local_epochs):
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    h = local.features(x)
                    if teacher is None:
                        loss = F.cross_entropy(local.head(h), y)
                    else:
                        with torch.no_grad():
                            h_g = teacher.features(x)
                        loss = cfg.beta * fk.losses.dot_regression(h, local.head.weight, y) \
                            + (1 - cfg.beta) * fk.losses.feature_distillation(h, h_g)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    loss.item()  # what a training loop logs every step
            states.append(local.state_dict())
            sizes.append(len(part.train_indices[k]))
        total = sum(sizes)
        average = {n: sum(s[n] * (w / total) for s, w in zip(states, sizes)) for n in states[0]}
        global_model.load_state_dict(average)
        sync(device)
        seconds.append(time.perf_counter() - t0)
    counted = seconds[2:]
    return sum(counted) / len(counted)


def measure(args: argparse.Namespace, data: fk.data.ImageData, device: torch.device, jsonl: Path | None) -> list[dict]:
    """Time every model × algorithm × engine; returns the CSV rows (also appended to ``jsonl`` as they come)."""
    rows = []
    for model in args.models:
        for algorithm in args.algorithms:
            cfg = fk.Config(dataset="synthetic", model=model, algorithm=algorithm, partition="shard",
                            num_clients=args.num_clients, clients_per_round=args.clients_per_round,
                            shards_per_client=args.shards, local_epochs=args.epochs, batch_size=args.batch_size,
                            rounds=args.rounds, progress=False, device=str(device), seed=0)
            for engine in args.engines:
                if engine == "dataloader":
                    sec = dataloader_seconds(cfg, data, device)
                else:
                    sec = kit_seconds(cfg.replace(engine=engine), data)
                row = {"device": device_name(device), "model": model, "algorithm": algorithm, "engine": engine,
                       "sec_per_round": round(sec, 4)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if jsonl is not None:
                    jsonl.parent.mkdir(parents=True, exist_ok=True)
                    with open(jsonl, "a") as f:
                        f.write(json.dumps({"check": "round_time", **row, "setting": setting(args)}) + "\n")
    return rows


def setting(args: argparse.Namespace) -> str:
    """The data and round shape, in words."""
    return (f"{args.classes} classes x {args.train_per_class} train images, {args.num_clients} clients "
            f"({args.clients_per_round} per round), s={args.shards}, E={args.epochs}, B={args.batch_size}")


def write_csv(rows: list[dict], out_dir: Path, device: torch.device) -> Path:
    """Merge ``rows`` into ``out_dir/round_time_<device>.csv`` (same keys replaced) and return its path."""
    slug = re.sub(r"[^a-z0-9]+", "_", device_name(device).lower()).strip("_")
    path = out_dir / f"round_time_{slug}.csv"
    new = pd.DataFrame(rows)
    if path.exists():
        old = pd.read_csv(path)
        keys = ["device", "model", "algorithm", "engine"]
        old = old[~old.set_index(keys).index.isin(new.set_index(keys).index)]
        new = pd.concat([old, new], ignore_index=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    new.to_csv(path, index=False)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["cnn", "vgg11", "mobilenet"], choices=fk.models.MODELS)
    p.add_argument("--algorithms", nargs="+", default=["fedavg", "feddr+"])
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--rounds", type=int, default=5, help="rounds per measurement, the first two are warm-up (>= 4)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=5000, help="5000 with 10 classes: CIFAR-10 shapes")
    p.add_argument("--test-per-class", type=int, default=100)
    p.add_argument("--num-clients", type=int, default=100)
    p.add_argument("--clients-per-round", type=int, default=10)
    p.add_argument("--shards", type=int, default=2, help="shards (classes) per client")
    p.add_argument("--epochs", type=int, default=2, help="local epochs E (paper: 10 on CIFAR-10, 3 on CIFAR-100)")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--out-dir", default="results", help="folder of the CSV")
    p.add_argument("--jsonl", default=None, help="also append one JSON line per measurement here")
    args = p.parse_args(argv)
    if args.rounds < 4:
        p.error("--rounds must be >= 4: two warm-up rounds, at least one counted, and the evaluated last one")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    data = fk.data.synthetic(args.classes, args.train_per_class, args.test_per_class).to(device)
    print(f"{device_name(device)}: {setting(args)}", flush=True)
    rows = measure(args, data, device, Path(args.jsonl) if args.jsonl else None)
    print(f"wrote {write_csv(rows, Path(args.out_dir), device)}")


if __name__ == "__main__":
    main()
