"""The GPU check, one script of at most ~8 minutes: round times at paper shapes and reproducibility.

Writes JSON lines to ``$OUT/gpu_check.jsonl`` (or ``--out``) as it goes, so a run cut short still
leaves what it measured, and the round-time CSV to ``$OUT/round_time_<gpu>.csv``:

1. a same-seed determinism check: two feddr+ runs (batched, ``deterministic=True``) must give an
   identical history and identical weights; then the same with ``deterministic=False`` (reported, not required);
2. seconds per round (``benchmarks/round_time.py``), fedavg and feddr+, batched / serial / dataloader:
   VGG11 on CIFAR-10 shapes (``synthetic(10, 5000, 1000)``, s=2, E=10) and MobileNet on CIFAR-100
   shapes (``synthetic(100, 500, 100)``, s=10, E=3); 100 clients, 10 per round, batches of 50;
3. peak GPU memory of a batched VGG11 round with 10 clients.

    OUT=/tmp/out python benchmarks/gpu_check.py              # on a GPU machine
    python benchmarks/gpu_check.py --tiny --out /tmp/check   # CPU smoke test of the script itself
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import round_time  # noqa: E402  (the benchmark next to this file)

import feddr_kit as fk  # noqa: E402
from feddr_kit.federated import resolve_device  # noqa: E402


def log(out: Path, record: dict) -> None:
    """Print ``record`` and append it to ``out/gpu_check.jsonl``."""
    line = json.dumps(record)
    print(line, flush=True)
    with open(out / "gpu_check.jsonl", "a") as f:
        f.write(line + "\n")


def determinism(out: Path, data, device: torch.device, model: str, rounds: int, deterministic: bool,
                num_clients: int = 100) -> None:
    """Two same-seed batched feddr+ runs; logs whether history and weights are identical."""
    cfg = fk.Config(dataset="synthetic", model=model, algorithm="feddr+", rounds=rounds, eval_every=1,
                    num_clients=num_clients, clients_per_round=10, local_epochs=1, progress=False, device=str(device),
                    engine="batched", deterministic=deterministic)
    t0 = time.perf_counter()
    a, b = fk.run(cfg, data=data), fk.run(cfg, data=data)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    max_diff = max(float((sa[n].double() - sb[n].double()).abs().max()) for n in sa)
    same_history = a.history.drop(columns="seconds").equals(b.history.drop(columns="seconds"))
    log(out, {"check": "determinism", "device": round_time.device_name(device), "model": model,
              "deterministic": deterministic, "rounds": rounds, "identical_history": bool(same_history),
              "identical_weights": max_diff == 0.0, "max_abs_weight_diff": max_diff,
              "final_acc": a.summary["final_acc"], "seconds": round(time.perf_counter() - t0, 1)})


def peak_memory(out: Path, data, device: torch.device, epochs: int) -> None:
    """Peak GPU memory (GiB) of batched VGG11 feddr+ rounds with 10 clients."""
    if device.type != "cuda":
        return
    torch.cuda.reset_peak_memory_stats(device)
    fk.run(fk.Config(dataset="synthetic", model="vgg11", algorithm="feddr+", rounds=1, num_clients=100,
                     clients_per_round=10, local_epochs=epochs, progress=False, engine="batched"), data=data)
    log(out, {"check": "peak_memory", "device": round_time.device_name(device), "model": "vgg11",
              "clients": 10, "engine": "batched", "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "results"))
    p.add_argument("--tiny", action="store_true", help="tiny shapes and cnn only: a smoke test of this script on CPU")
    p.add_argument("--rounds", type=int, default=4, help="rounds per timing (two warm-up)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device("auto")
    log(out, {"check": "start", "device": round_time.device_name(device), "torch": torch.__version__})

    if args.tiny:
        settings = [("cnn", 10, 20, 10, 2, 1)]
    else:  # model, classes, train/class, test/class, shards per client, local epochs
        settings = [("vgg11", 10, 5000, 1000, 2, 10), ("mobilenet", 100, 500, 100, 10, 3)]
    datasets = {}
    for model, classes, train, test, shards, epochs in settings:
        datasets[model] = fk.data.synthetic(classes, train, test).to(device)

    first = settings[0]
    clients = 10 if args.tiny else 100
    determinism(out, datasets[first[0]], device, first[0], rounds=2, deterministic=True, num_clients=clients)
    determinism(out, datasets[first[0]], device, first[0], rounds=2, deterministic=False, num_clients=clients)
    if not args.tiny:
        peak_memory(out, datasets["vgg11"], device, epochs=1)

    rows = []
    for model, classes, train, test, shards, epochs in settings:
        bench = round_time.parse_args([
            "--models", model, "--engines", "batched", "serial", "dataloader", "--rounds", str(args.rounds),
            "--classes", str(classes), "--train-per-class", str(train), "--test-per-class", str(test),
            "--shards", str(shards), "--epochs", str(epochs),
            "--num-clients", "10" if args.tiny else "100", "--clients-per-round", "3" if args.tiny else "10"])
        rows += round_time.measure(bench, datasets[model], device, out / "gpu_check.jsonl")
    log(out, {"check": "done", "csv": str(round_time.write_csv(rows, out, device))})


if __name__ == "__main__":
    main()
