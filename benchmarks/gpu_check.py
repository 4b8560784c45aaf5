"""The GPU check: one script, within a fixed time budget, that proves the training core on CUDA.

Steps, most important first; each writes JSON lines to ``$OUT/gpu_check.jsonl`` (or ``--out``) as it
goes, and a step that would not fit in what is left of ``--budget`` is skipped and logged as skipped,
so a run cut short still leaves everything it measured:

1. determinism: two same-seed feddr+ runs (VGG-11, synthetic CIFAR-10 shapes) must give an identical
   history and identical weights, batched and serial with ``deterministic=True``; batched with
   ``deterministic=False`` is reported, not required;
2. seconds per round (``benchmarks/round_time.py``) of VGG-11 at the paper's CIFAR-10 shape
   (``synthetic(10, 5000, 1000)``, s=2, E=10), fedavg and feddr+, batched and serial, with the GPU's
   busy share over the measurement (NVML's utilisation: the share of time some kernel was running);
3. the paper's feature regime on real CIFAR-10: FedDr+ with VGG-11 at the paper's s=2 setting (10 of
   100 clients, E=10, lr 0.35, its 320-round schedule, so the lr is constant in what fits), every
   round evaluated, so each row carries the FD:DR gradient ratios and the global feature norm, for
   ``--regime-seconds`` of wall time;
4. the cost of ``precision="bf16"`` and of ``deterministic=False`` on the batched VGG-11 feddr+ round;
5. MobileNet at the paper's CIFAR-100 shape (``synthetic(100, 500, 100)``, s=10, E=3), the same timings;
6. the DataLoader reference (the way typical FL code writes a round) for both models;
7. peak GPU memory of a batched VGG-11 round;
8. the feature regime of MobileNet on real CIFAR-10 at s=10, E=3, lr 5.0, if time is left.

At the end (or later, from the JSON lines: ``--tables-from``) it writes ``round_time_<gpu>.csv``
(the columns of ``benchmarks/round_time.py``) and ``paper_regime_<gpu>.csv`` (one row per round).

    OUT=/tmp/out FEDDR_DATA_DIR=/tmp/data python benchmarks/gpu_check.py     # on a GPU machine
    python benchmarks/gpu_check.py --tiny --out /tmp/check                   # CPU smoke test of the script
    python benchmarks/gpu_check.py --tables-from results/gpu/*.jsonl --out results
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import round_time  # noqa: E402  (the benchmark next to this file)

import feddr_kit as fk  # noqa: E402
from feddr_kit.federated import resolve_device  # noqa: E402

PAPER_REGIME = {  # the paper's FedDr+ settings (appendix C; spec §1.6), on real CIFAR-10
    "vgg11-s2": dict(model="vgg11", lr=0.35, local_epochs=10, shards_per_client=2),
    "mobilenet-s10": dict(model="mobilenet", lr=5.0, local_epochs=3, shards_per_client=10),
}
TINY_REGIME = dict(model="cnn", lr=None, local_epochs=1)  # --tiny: the same code path at CPU cost
TIMING_SHAPES = {  # model: (classes, train/class, test/class, shards per client, local epochs)
    "vgg11": (10, 5000, 1000, 2, 10),
    "mobilenet": (100, 500, 100, 10, 3),
}


STEPS = ["determinism", "vgg11-times", "vgg11-dataloader", "vgg11-regime", "mobilenet-times", "vgg11-options",
         "mobilenet-dataloader", "peak-memory", "mobilenet-regime", "fastest", "profile"]


class Budget:
    """Wall-clock budget of the whole script; ``fits(s)`` says whether ``s`` more seconds fit."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def fits(self, seconds: float) -> bool:
        return self.left() > seconds


class Log:
    """Prints each record and appends it to ``out/gpu_check.jsonl``."""

    def __init__(self, out: Path, device: torch.device):
        self.path, self.device = out / "gpu_check.jsonl", round_time.device_name(device)

    def __call__(self, record: dict) -> None:
        line = json.dumps({**record, "device": self.device})
        print(line, flush=True)
        with open(self.path, "a") as f:
            f.write(line + "\n")


class BusySampler:
    """Mean NVML GPU utilisation (% of time a kernel ran) while the ``with`` block runs; None off CUDA."""

    def __init__(self, device: torch.device, every_s: float = 0.05):
        self.device, self.every_s, self.samples = device, every_s, []
        self._stop = threading.Event()
        self._handle = None
        if device.type == "cuda":
            with contextlib.suppress(Exception):  # no NVML (nvidia-ml-py) means no reading, not a failure
                import pynvml
                pynvml.nvmlInit()
                self._nvml = pynvml
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __enter__(self) -> "BusySampler":
        if self._handle is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._stop.set()
            self._thread.join()

    @property
    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 1) if self.samples else None


def determinism(log: Log, data, device: torch.device, model: str, engine: str, deterministic: bool,
                num_clients: int) -> bool:
    """Two same-seed feddr+ runs of 2 rounds; logs whether history and weights are identical.

    Returns False when the runs failed (the error is logged)."""
    cfg = fk.Config(dataset="synthetic", model=model, algorithm="feddr+", rounds=2, eval_every=1,
                    num_clients=num_clients, clients_per_round=10, local_epochs=1, progress=False,
                    device=str(device), engine=engine, deterministic=deterministic)
    t0 = time.perf_counter()
    try:
        a, b = fk.run(cfg, data=data), fk.run(cfg, data=data)
    except Exception as err:  # a CUDA failure is a finding: log it and go on with the other steps
        log({"check": "determinism", "model": model, "engine": engine, "deterministic": deterministic,
             "error": f"{type(err).__name__}: {err}"})
        return False
    sa, sb = a.model.state_dict(), b.model.state_dict()
    max_diff = max(float((sa[n].double() - sb[n].double()).abs().max()) for n in sa)
    same_history = a.history.drop(columns="seconds").equals(b.history.drop(columns="seconds"))
    log({"check": "determinism", "model": model, "engine": engine, "deterministic": deterministic,
         "identical_history": bool(same_history), "identical_weights": max_diff == 0.0,
         "max_abs_weight_diff": max_diff, "final_acc": a.summary["final_acc"],
         "seconds": round(time.perf_counter() - t0, 1)})
    return True


def round_seconds(log: Log, data, device: torch.device, model: str, algorithm: str, engine: str, rounds: int,
                  tiny: bool, **options) -> None:
    """Seconds per round of one model × algorithm × engine (``round_time``'s protocol), with the GPU's busy share.

    ``options`` (``precision``, ``deterministic``) are set on the kit's config; they name the row's engine
    (``batched+bf16``, ``batched+nondeterministic``)."""
    classes, train, test, shards, epochs = (10, 20, 10, 2, 1) if tiny else TIMING_SHAPES[model]
    args = round_time.parse_args([
        "--models", model, "--algorithms", algorithm, "--rounds", str(rounds), "--classes", str(classes),
        "--train-per-class", str(train), "--test-per-class", str(test), "--shards", str(shards),
        "--epochs", str(epochs), "--num-clients", "10" if tiny else "100", "--clients-per-round", "3" if tiny else "10"])
    cfg = fk.Config(dataset="synthetic", model=model, algorithm=algorithm, partition="shard",
                    num_clients=args.num_clients, clients_per_round=args.clients_per_round, shards_per_client=shards,
                    local_epochs=epochs, batch_size=args.batch_size, rounds=rounds, progress=False,
                    device=str(device), seed=0)
    name = engine + ("+bf16" if options.get("precision") == "bf16" else "") \
        + ("+nondeterministic" if options.get("deterministic") is False else "")
    try:
        with BusySampler(device) as busy:
            if engine == "dataloader":
                sec = round_time.dataloader_seconds(cfg, data, device)
            else:
                sec = round_time.kit_seconds(cfg.replace(engine=engine, **options), data)
    except Exception as err:
        log({"check": "round_time", "model": model, "algorithm": algorithm, "engine": name,
             "error": f"{type(err).__name__}: {err}"})
        return
    log({"check": "round_time", "model": model, "algorithm": algorithm, "engine": name,
         "sec_per_round": round(sec, 4), "gpu_busy_pct": busy.mean, "setting": round_time.setting(args)})


class OutOfTime(Exception):
    """Raised from a run's callback when its share of the budget is spent."""


def paper_regime(log: Log, data, device: torch.device, setting: str, seconds: float, tiny: bool) -> None:
    """FedDr+ at the paper's setting on real data, one evaluated row per round, for ``seconds`` of wall time."""
    settings = PAPER_REGIME[setting]
    cfg = fk.Config(dataset="cifar10", algorithm="feddr+", partition="shard", num_clients=10 if tiny else 100,
                    clients_per_round=3 if tiny else 10, rounds=320, eval_every=1, progress=False, seed=0,
                    device=str(device), **{**settings, **(TINY_REGIME if tiny else {})})
    end = time.monotonic() + seconds

    def row(r: dict) -> None:
        log({"check": "paper_regime", "setting": setting, "model": cfg.model, "lr0": cfg.lr,
             "local_epochs": cfg.local_epochs, "shards_per_client": cfg.shards_per_client, "engine": cfg.engine,
             "clients_per_round": cfg.clients_per_round, **{k: (float(v) if hasattr(v, "item") else v)
                                                            for k, v in r.items()}})
        if time.monotonic() > end:
            raise OutOfTime

    try:
        fk.run(cfg, data=data, callback=row)
    except OutOfTime:
        pass
    except Exception as err:
        log({"check": "paper_regime", "setting": setting, "error": f"{type(err).__name__}: {err}"})


def kernel_profile(log: Log, data, device: torch.device, model: str, deterministic: bool, top: int = 8) -> None:
    """The GPU kernels that take the time of one batched feddr+ round (10 clients, E=1), by self device time."""
    if device.type != "cuda":
        return
    cfg = fk.Config(dataset="synthetic", model=model, algorithm="feddr+", rounds=1, num_clients=100,
                    clients_per_round=10, local_epochs=1, progress=False, engine="batched", deterministic=deterministic)
    try:
        fk.run(cfg, data=data)  # warm-up: cuDNN's choices and the allocator
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fk.run(cfg, data=data)
        events = prof.key_averages()
    except Exception as err:
        log({"check": "kernel_profile", "model": model, "error": f"{type(err).__name__}: {err}"})
        return

    def device_us(e) -> float:
        return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0))

    total = sum(device_us(e) for e in events) or 1.0
    for e in sorted(events, key=device_us, reverse=True)[:top]:
        log({"check": "kernel_profile", "model": model, "deterministic": deterministic, "kernel": e.key[:120],
             "calls": e.count, "device_ms": round(device_us(e) / 1e3, 1), "share": round(device_us(e) / total, 3)})


def peak_memory(log: Log, data, device: torch.device) -> None:
    """Peak GPU memory (GiB) of one batched VGG-11 feddr+ round with 10 clients, E=1."""
    if device.type != "cuda":
        return
    torch.cuda.reset_peak_memory_stats(device)
    fk.run(fk.Config(dataset="synthetic", model="vgg11", algorithm="feddr+", rounds=1, num_clients=100,
                     clients_per_round=10, local_epochs=1, progress=False, engine="batched"), data=data)
    log({"check": "peak_memory", "model": "vgg11", "clients": 10, "engine": "batched",
         "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)})


def slug(device_name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_")


def write_tables(jsonls: list[Path], out: Path) -> list[Path]:
    """``round_time_<gpu>.csv`` and ``paper_regime_<gpu>.csv`` in ``out`` from the records in ``jsonls`` (in order)."""
    records = [json.loads(line) for jsonl in jsonls for line in jsonl.read_text().splitlines() if line.strip()]
    written = []
    for check, name, columns in (
            ("round_time", "round_time", ["device", "model", "algorithm", "engine", "sec_per_round", "gpu_busy_pct", "setting"]),
            ("paper_regime", "paper_regime", None)):
        rows = [r for r in records if r.get("check") == check and "error" not in r]
        if not rows:
            continue
        for device, group in pd.DataFrame(rows).drop(columns="check").groupby("device", sort=False):
            table = group
            if columns:  # a timing measured twice keeps its last reading, as round_time.py's CSV does
                table = table[[c for c in columns if c in table]].drop_duplicates(
                    ["device", "model", "algorithm", "engine"], keep="last")
            path = out / f"{name}_{slug(device)}.csv"
            table.dropna(axis=1, how="all").to_csv(path, index=False)
            written.append(path)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "results"))
    p.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke test of this script on CPU")
    p.add_argument("--budget", type=float, default=420, help="seconds for the whole script")
    p.add_argument("--regime-seconds", type=float, default=120, help="seconds for the VGG-11 feature-regime run")
    p.add_argument("--rounds", type=int, default=4, help="rounds per timing (two warm-up, the last evaluated)")
    p.add_argument("--steps", nargs="+", default=STEPS, choices=STEPS, help="which steps, in this order")
    p.add_argument("--tables-from", nargs="+", default=None, help="only write the CSVs from these gpu_check.jsonl files")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.tables_from:
        for path in write_tables([Path(j) for j in args.tables_from], out):
            print(f"wrote {path}")
        return
    budget = Budget(args.budget)
    device = resolve_device("auto")
    log = Log(out, device)
    log({"check": "start", "torch": torch.__version__, "cuda": torch.version.cuda, "budget_s": args.budget})

    models = ["cnn"] if args.tiny else ["vgg11", "mobilenet"]
    synthetic = {m: fk.data.synthetic(*((10, 20, 10) if args.tiny else TIMING_SHAPES[m][:3])).to(device) for m in models}
    first, clients = models[0], 10 if args.tiny else 100
    real = fk.data.load("cifar10").to(device)

    def step(estimate_s: float, what: str, fn, *a, **kw):
        if budget.fits(estimate_s):
            return fn(*a, **kw)
        log({"check": "skipped", "what": what, "estimate_s": estimate_s, "left_s": round(budget.left(), 1)})

    ok = {} if "determinism" not in args.steps else {(engine, deterministic): step(30, f"determinism {engine} {deterministic}", determinism, log,
                                        synthetic[first], device, first, engine, deterministic, clients)
          for engine, deterministic in (("batched", True), ("serial", True), ("batched", False))}
    # The kit's default is deterministic=True; if that crashed on this GPU the timings still run, without it
    # (and their rows say "+nondeterministic").
    timing = {} if ok.get(("batched", True)) is not False else {"deterministic": False}

    def timings(model: str, algorithms, engines, estimate_s: float, **options) -> None:
        for algorithm in algorithms:
            for engine in engines:
                opts = {**timing, **options} if engine != "dataloader" else {}
                step(estimate_s, f"round_time {model} {algorithm} {engine} {opts}", round_seconds, log,
                     synthetic[model], device, model, algorithm, engine, args.rounds, args.tiny, **opts)

    steps = {
        "vgg11-times": lambda: timings(first, ("feddr+", "fedavg"), ("batched", "serial"), 40),
        "vgg11-dataloader": lambda: timings(first, ("feddr+",), ("dataloader",), 60),
        "vgg11-regime": lambda: step(args.regime_seconds + 30, "paper_regime vgg11-s2", paper_regime, log, real,
                                     device, "vgg11-s2", args.regime_seconds, args.tiny),
        "mobilenet-times": lambda: args.tiny or timings("mobilenet", ("feddr+", "fedavg"), ("batched", "serial"), 30),
        "vgg11-options": lambda: [timings(first, ("feddr+",), ("batched",), 20, **o)
                                  for o in ({"precision": "bf16"}, {"deterministic": False})],
        "fastest": lambda: [timings(m, ("feddr+",), ("batched",), 20, **o) for m in models
                            for o in ({"deterministic": False}, {"precision": "bf16", "deterministic": False})],
        "profile": lambda: [step(30, f"kernel_profile {first} {d}", kernel_profile, log, synthetic[first], device,
                                 first, d) for d in (True, False)],
        "mobilenet-dataloader": lambda: args.tiny or timings("mobilenet", ("feddr+",), ("dataloader",), 40),
        "peak-memory": lambda: step(15, "peak_memory", peak_memory, log, synthetic[first], device),
        "mobilenet-regime": lambda: step(60, "paper_regime mobilenet-s10", paper_regime, log, real, device,
                                         "mobilenet-s10", budget.left() - 20, args.tiny),
    }
    for name in args.steps:
        if name != "determinism":  # it ran first: the timings' settings depend on it
            steps[name]()
    written = write_tables([log.path], out)
    log({"check": "done", "csv": [str(p) for p in written], "left_s": round(budget.left(), 1)})


if __name__ == "__main__":
    main()
