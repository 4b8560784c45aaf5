"""One GPU lease: CIFAR-10 rebuilt from the carried npz, the kit's round timed against a plain model, then the paper's runs.

In one process, within ``--budget`` seconds, writing under ``--out`` (``$OUT``) as it goes, so a run cut short
keeps everything that finished:

1. **data**: ``data/cifar10-jpeg-bytes.npz`` (carried; git-ignored) unpacked byte for byte into an image folder
   (:func:`unpack`), and ``FEDDR_DATA_DIR`` pointed at it;
2. **the plain-model reference** (:func:`plain_rate`): one VGG-11 (CIFAR-10 shapes) and one MobileNet (CIFAR-100
   shapes) trained on batches of 500, fp32 without and with TF32, and bf16 autocast with channels-last; images
   per second, and the seconds of a round's arithmetic at that rate (50,000 image-steps for VGG-11 at s = 2,
   E = 10; 15,000 for MobileNet at s = 10, E = 3), with a teacher's forward pass for FedDr+;
3. **the kit's round** (:func:`kit_round`): the batched engine for VGG-11 FedDr+ with each engine option
   (``channels_last``, ``fused_sgd``, bf16, TF32 off), then FedAvg and MobileNet FedDr+ with the fastest,
   ``deterministic`` False and True; seconds per round (rounds 3..R-1 of an R-round run), the GPU's busy
   share for the defaults and the fastest options (the time some kernel ran during the last round's training,
   under ``torch.profiler``, over a round's wall time; NVML's reading too where ``pynvml`` is installed), and
   the target each FedDr+ row meets or misses. One row each in ``lease_times.csv``;
4. **the paper's runs** (``results/paper_scale.py``) with the time left: the next runs of its priority list
   that fit, side by side, each copied to ``paper_scale/`` as it finishes.

On a lent GPU (the ``run`` tool; carry the npz, ~20 MiB, with the checkout):

    cp ../shared/data/cifar10-jpeg-bytes.npz data/
    run(command="PYTHONPATH=. python3 benchmarks/paper_scale_lease.py --budget 480",
        carry=["data/cifar10-jpeg-bytes.npz"], timeout_s=540)

then copy ``<files_at>/paper_scale/.`` into ``results/paper_scale/``, run ``python results/paper_scale.py
--collect-only`` and commit, with ``lease_times.csv`` as ``results/gpu/lease_times_<gpu>.csv``. On CPU, a
smoke test of this script at tiny sizes (a cnn, synthetic data, a slice of the npz):

    PYTHONPATH=. python benchmarks/paper_scale_lease.py --tiny --out /tmp/lease

Needs only torch, torchvision, pandas and tqdm (and the kit's checkout on ``PYTHONPATH``).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "results"))
import gpu_check  # noqa: E402  (its Budget and NVML sampler)
import paper_scale  # noqa: E402  (the recipe, and the timing CSVs' engine labels)

import feddr_kit as fk  # noqa: E402
from feddr_kit.rundir import write_text  # noqa: E402

NPZ = REPO / "data" / "cifar10-jpeg-bytes.npz"
CSV = "lease_times.csv"
# A round's image-steps: 10 clients × 500 images × E (the paper's CIFAR-10 VGG-11 and CIFAR-100 MobileNet settings).
SHAPES = {  # model: (classes, train images per class, test per class, shards per client, local epochs)
    "vgg11": (10, 5000, 1000, 2, 10),
    "mobilenet": (100, 500, 100, 10, 3),
}
TINY_SHAPE = (10, 20, 10, 2, 1)
# The targets, seconds per FedDr+ round with deterministic=False (at most twice that with True), and busy %.
TARGETS = {"vgg11": 0.65, "mobilenet": 0.5}
BUSY_TARGET = 70.0
OPTIONS = [  # the engine options timed on VGG-11 FedDr+, in this order (each also with the two before it where they help)
    {}, {"channels_last": True}, {"fused_sgd": True}, {"channels_last": True, "fused_sgd": True},
    {"precision": "bf16"}, {"precision": "bf16", "channels_last": True, "fused_sgd": True}, {"tf32": False},
]
COLUMNS = ["device", "kind", "model", "algorithm", "engine", "sec_per_round", "images_per_s", "gpu_busy_pct",
           "nvml_busy_pct", "target_s", "meets_target", "reference_s", "setting", "error"]


# --------------------------------------------------------------------------- 1. the data
def unpack(npz: Path, dest: Path, every: int = 1) -> int:
    """Write the image folder ``dest/cifar10-jpeg/{train,test}/<class>/<name>`` from the packed file, each JPEG byte
    for byte (``prefix`` + its tail; an older layout of whole files in ``{split}_bytes`` is read too). ``every``:
    only every ``every``-th image of each split (a smoke test). Returns the number of files written."""
    z = np.load(npz)
    prefix = z["prefix"].tobytes() if "prefix" in z.files else b""
    classes = [str(c) for c in z["classes"]]
    count = 0
    for split in ("train", "test"):
        blob = z[f"{split}_tails"] if prefix else z[f"{split}_bytes"]
        offsets, labels, names = z[f"{split}_offsets"], z[f"{split}_labels"], z[f"{split}_names"]
        for c in classes:
            (dest / "cifar10-jpeg" / split / c).mkdir(parents=True, exist_ok=True)
        for i in range(0, len(labels), every):
            path = dest / "cifar10-jpeg" / split / classes[labels[i]] / str(names[i])
            path.write_bytes(prefix + blob[offsets[i]:offsets[i + 1]].tobytes())
            count += 1
    return count


# --------------------------------------------------------------------------- 2. the plain-model reference
def plain_rate(model_name: str, classes: int, device: torch.device, *, batch: int, steps: int, precision: str = "fp32",
               channels_last: bool = False, tf32: bool = True, teacher: bool = False) -> float:
    """Images per second of one model trained alone: SGD steps on batches of ``batch`` random images ``[B,3,32,32]``,
    cross-entropy, ``precision`` ``"bf16"`` under autocast; ``teacher``: also a frozen copy's forward pass and an MSE
    of the features to it (FedDr+'s arithmetic). After 5 warm-up steps, ``steps`` timed ones."""
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = fk.models.build_model(model_name, classes).to(device, memory_format=fmt).train()
    frozen = copy.deepcopy(model).eval().requires_grad_(False) if teacher else None
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=1e-5)
    x = torch.randn(batch, 3, 32, 32, device=device).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (batch,), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step() -> None:
        with autocast:
            h = model.features(x)
            loss = F.cross_entropy(model.head(h), y)
            if frozen is not None:
                with torch.no_grad():
                    h_g = frozen.features(x)
                loss = loss + F.mse_loss(h, h_g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    with fk.engine.kernel_settings(False, device, tf32):
        for _ in range(5):
            step()
        gpu_check.round_time.sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        gpu_check.round_time.sync(device)
    return steps * batch / (time.perf_counter() - t0)


# --------------------------------------------------------------------------- 3. the kit's round
def busy_seconds(events) -> float:
    """Seconds during which some kernel or copy ran: the length of the union of the device events' intervals
    (``torch.profiler``'s events, times in µs), so overlapping kernels are counted once."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    total, end = 0.0, -math.inf
    for start, stop in spans:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total / 1e6


@contextlib.contextmanager
def profiled_training(round_index: int | None, device: torch.device):
    """While active, the training of round ``round_index`` of a run (``fk.engine.train_round``, aggregation included)
    runs under ``torch.profiler``; yields a dict that then holds ``kernel_s``, the seconds some kernel or copy ran
    (:func:`busy_seconds`). Nothing is profiled off CUDA or with ``round_index=None``."""
    found: dict = {}
    original = fk.engine.train_round
    if round_index is None or device.type != "cuda":
        yield found
        return

    def profiled(gen):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            yield from gen
            torch.cuda.synchronize(device)
        found["kernel_s"] = busy_seconds(prof.events())

    def train_round(engine, model, teacher, algo, data, client_idx, ctxs, cfg, dev):
        gen = original(engine, model, teacher, algo, data, client_idx, ctxs, cfg, dev)
        return profiled(gen) if ctxs[0].round == round_index else gen

    fk.engine.train_round = train_round
    try:
        yield found
    finally:
        fk.engine.train_round = original


def kit_round(cfg: fk.Config, data, device: torch.device, rounds: int, profile: bool) -> dict:
    """Seconds per round of ``fk.run(cfg)`` over rounds 3..R-1 (two warm-up rounds; the last one is evaluated and,
    with ``profile``, profiled, so neither counts), the NVML busy share over the run (None without NVML), and with
    ``profile`` the busy share ``kernel_s / sec_per_round`` (%)."""
    with tempfile.TemporaryDirectory() as out, profiled_training(rounds - 1 if profile else None, device) as prof, \
            gpu_check.BusySampler(device) as nvml:
        fk.run(cfg.replace(rounds=rounds, eval_every=rounds, checkpoint_every=0, out_dir=out, progress=False), data=data)
        seconds = torch.load(Path(out) / fk.federated.CHECKPOINT, weights_only=False)["round_seconds"][2:-1]
    sec = sum(seconds) / len(seconds)
    busy = round(100 * prof["kernel_s"] / sec, 1) if prof.get("kernel_s") else None  # 0: no device events seen
    return {"sec_per_round": round(sec, 4), "gpu_busy_pct": busy, "nvml_busy_pct": nvml.mean}


class Table:
    """``out/lease_times.csv``, rewritten (atomically) after every row, and each row printed as a JSON line."""

    def __init__(self, out: Path, device: torch.device):
        self.path, self.device, self.rows = out / CSV, gpu_check.round_time.device_name(device), []

    def add(self, **row) -> dict:
        row = {"device": self.device, **row}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        write_text(self.path, pd.DataFrame(self.rows, columns=COLUMNS).to_csv(index=False))
        return row


def measure(args: argparse.Namespace, table: Table, budget: gpu_check.Budget, device: torch.device) -> None:
    """Steps 2 and 3, most informative first; a step whose estimate does not fit what is left of the timing
    budget is logged as skipped."""
    tiny = args.tiny
    name = {"vgg11": "cnn" if tiny else "vgg11", "mobilenet": "cnn" if tiny else "mobilenet"}
    batch, steps, rounds = (8, 3, 4) if tiny else (500, 50, args.rounds)
    data = {m: fk.data.synthetic(*(TINY_SHAPE if tiny else SHAPES[m])[:3]) for m in SHAPES}
    if not tiny:  # VGG-11 on the real images where they are (the round's time does not depend on the pixels)
        try:
            data["vgg11"] = fk.data.load("cifar10")
        except fk.FeddrKitError as err:
            table.add(kind="data", error=f"VGG-11 timed on synthetic CIFAR-10 shapes: {err}")
    data = {m: d.to(device) for m, d in data.items()}
    reference: dict[tuple[str, str], float] = {}  # (model, algorithm) -> seconds of a round's arithmetic, bf16 + NHWC
    timed: dict[tuple[str, str, str], float] = {}  # (model, algorithm, engine label) -> seconds per round
    profiled: set[tuple[str, str, str]] = set()  # those timed with their busy share (a profile costs seconds)

    def fits(estimate_s: float, what: str) -> bool:
        if budget.fits(estimate_s):
            return True
        table.add(kind="skipped", setting=what, error=f"estimated {estimate_s:.0f} s, {budget.left():.0f} s left")
        return False

    for m, (classes, train, _, _, epochs) in SHAPES.items():  # 2. the plain model
        image_steps = 10 * train * classes // 100 * epochs  # 10 of 100 clients, each 1 % of the set, E epochs
        for label, kw in (("fp32, TF32 off", dict(tf32=False)), ("fp32, TF32", {}),
                          ("bf16 + channels_last", dict(precision="bf16", channels_last=True)),
                          ("bf16 + channels_last, with a teacher", dict(precision="bf16", channels_last=True, teacher=True))):
            if not fits(10, f"plain {m} {label}"):
                continue
            rate = plain_rate(name[m], TINY_SHAPE[0] if tiny else classes, device, batch=batch, steps=steps, **kw)
            if label.startswith("bf16"):
                reference[(m, "feddr+" if kw.get("teacher") else "fedavg")] = image_steps / rate
            table.add(kind="reference", model=name[m], algorithm="feddr+" if kw.get("teacher") else "fedavg",
                      engine=f"plain, batch {batch}, {label}", images_per_s=round(rate), sec_per_round=round(image_steps / rate, 4),
                      setting=f"{image_steps} image-steps a round")

    def kit(m: str, algorithm: str, options: dict, deterministic: bool, profile: bool, estimate_s: float) -> float | None:
        opts = {**options, "deterministic": deterministic, "engine": "batched"}
        label = paper_scale.engine_label(opts)
        key, profile = (m, algorithm, label), profile and device.type == "cuda"  # no device events off CUDA
        if key in timed and (key in profiled or not profile):  # the fastest options may be the defaults
            return timed[key]
        if not fits(estimate_s, f"kit {m} {algorithm} {label}"):
            return None
        classes, _, _, shards, epochs = TINY_SHAPE if tiny else SHAPES[m]
        dataset = "synthetic" if data[m].name.startswith("synthetic") else "cifar10"
        cfg = fk.Config(dataset=dataset, model=name[m], algorithm=algorithm,
                        partition="shard", shards_per_client=shards, local_epochs=epochs, num_clients=10 if tiny else 100,
                        clients_per_round=3 if tiny else 10, seed=0, **opts)
        target = TARGETS[m] * (1 if not deterministic else 2) if algorithm == "feddr+" else None
        try:
            got = kit_round(cfg, data[m], device, rounds, profile)
        except Exception as err:  # a failure on this GPU is a finding: logged, and the other timings go on
            table.add(kind="kit", model=name[m], algorithm=algorithm, engine=label, error=f"{type(err).__name__}: {err}")
            return None
        timed[key] = got["sec_per_round"]
        if profile:
            profiled.add(key)
        meets = None if target is None else bool(got["sec_per_round"] <= target and (got["gpu_busy_pct"] or 0) >= BUSY_TARGET)
        table.add(kind="kit", model=name[m], algorithm=algorithm, engine=label, target_s=target, meets_target=meets,
                  reference_s=reference.get((m, algorithm)), setting=f"{cfg.num_clients} clients, s={shards}, E={epochs}",
                  **got)
        return got["sec_per_round"]

    est = 6 * rounds + 15  # seconds of a timing at VGG-11's slowest measured round (4.8 s), set-up and a profile
    times = {}
    for options in OPTIONS:  # 3. the kit: every option on VGG-11 FedDr+ without determinism
        times[json.dumps(options)] = kit("vgg11", "feddr+", options, False, not options, est)
    measured = {k: v for k, v in times.items() if v is not None}
    best = json.loads(min(measured, key=measured.get)) if measured else {}
    table.add(kind="choice", engine=paper_scale.engine_label({**best, "deterministic": False}),
              setting="the fastest options on VGG-11 FedDr+, timed next on the other cells")
    for m, algorithm, options, deterministic, profile in (  # the busy share of the defaults and of the fastest
            ("vgg11", "feddr+", best, False, True), ("vgg11", "feddr+", {}, True, True),
            ("vgg11", "feddr+", best, True, False), ("vgg11", "fedavg", {}, False, False),
            ("vgg11", "fedavg", best, False, False), ("mobilenet", "feddr+", {}, False, True),
            ("mobilenet", "feddr+", best, False, True), ("mobilenet", "feddr+", best, True, False),
            ("vgg11", "fedavg", best, True, False)):
        kit(m, algorithm, options, deterministic, profile, est)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "lease_out"), help="where the results go (default $OUT)")
    p.add_argument("--budget", type=float, default=480, help="seconds for the whole script")
    p.add_argument("--timing-seconds", type=float, default=270, help="of which the timings (steps 2 and 3) may take")
    p.add_argument("--rounds", type=int, default=5, help="rounds per kit timing: two warm-up, the last evaluated (>= 4)")
    p.add_argument("--jobs", type=int, default=3, help="paper-scale runs side by side (results/paper_scale.py --jobs)")
    p.add_argument("--npz", default=str(NPZ), help="the packed CIFAR-10 (carried into data/)")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "feddr_data"), help="where to unpack it")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: a cnn on synthetic data, a slice of the npz")
    args = p.parse_args(argv)
    if args.rounds < 4:
        p.error("--rounds must be >= 4")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = gpu_check.Budget(args.budget)
    device = fk.engine.resolve_device("auto")
    table = Table(out, device)
    table.add(kind="start", setting=f"torch {torch.__version__}, CUDA {torch.version.cuda}, budget {args.budget:.0f} s")

    npz = Path(args.npz)  # 1. the data
    if npz.is_file():
        t0 = time.perf_counter()
        n = unpack(npz, Path(args.data_dir), every=500 if args.tiny else 1)
        table.add(kind="data", setting=f"{n} files from {npz.name} in {time.perf_counter() - t0:.1f} s")
        if not args.tiny:  # the tiny run trains on synthetic data; its slice only checks the unpacking
            os.environ["FEDDR_DATA_DIR"] = args.data_dir
    elif not args.tiny:
        table.add(kind="data", error=f"{npz} not found: using FEDDR_DATA_DIR={os.environ.get('FEDDR_DATA_DIR')}")

    timing = gpu_check.Budget(min(args.timing_seconds, budget.left()))
    measure(args, table, timing, device)

    left = budget.left() - 20  # 4. the paper's runs with the rest (20 s for the last copies and the exit)
    recipe = ["--budget", f"{left:.0f}", "--jobs", str(args.jobs), "--export", str(out / "paper_scale"),
              "--timing", str(table.path)]
    if args.tiny:
        recipe += ["--tiny", "--root", str(out / "paper_scale_runs"), "--seeds", "0"]
    table.add(kind="recipe", setting=" ".join(recipe))
    if device.type == "cuda":  # the timings' memory back to the GPU, for the runs' processes
        torch.cuda.empty_cache()
    started = paper_scale.main(recipe)
    table.add(kind="done", setting=f"{sum(len(u.seconds) for u in started)} paper-scale runs started; "
                                   f"{budget.left():.0f} s left")


if __name__ == "__main__":
    main()
