"""Scale or method: where does FedDr+'s advantage appear? A pre-registered CPU probe of client drift
and BatchNorm at shard s = 2 on real CIFAR-10.

At the teaching scale (``cnn_bn``, one local epoch) none of FedDr+'s advantages shows: it trails FedAvg
at s = 2 and ties the β-scaled DR control on every measure. Two things besides size separate that
scale from the paper's CIFAR-10 runs: the paper's VGG-11 has no BatchNorm, and its clients train ten
local epochs per round, so each round's drift, which feature distillation (FD) exists to resist, is
much larger. This probe varies those two things, and nothing else, on the teaching model.

PRE-REGISTRATION. Everything below was fixed and committed before the first run; the verdicts are
whatever the runs give.

Design (a 2 × 2 factorial of cells, three methods in each):
- Models: ``cnn_bn`` (the teaching model: BatchNorm on batch statistics) and ``cnn_nobn`` (the same
  network with its BatchNorm layers removed; each convolution takes the bias that BatchNorm's shift gave,
  and the convolutions are initialised as the paper's BatchNorm-free VGG-11, He-normal with fan-out,
  because without a normalization PyTorch's default init shrinks the signal at every stage). Nothing
  else differs, so a difference between the two models is BatchNorm's.
- Local epochs E: 1 (the teaching scale) and 5. E = 10 (the paper's) is not run: at 80 rounds it would
  double the budget of the whole probe.
- Methods: FedAvg; FedDr+ (β = 0.9); the control, DR without FD at FedDr+'s lr × β
  (``fk.federated.beta_scaled_dr``), which is FedDr+ with the FD term taken out and nothing else.
- Fixed everywhere: real CIFAR-10, 100 clients, shard s = 2, 10 clients per round, batch 50, SGD with
  momentum 0.9 and weight decay 1e-5, 80 rounds, lr × 0.1 at rounds 40 and 60 (the kit's schedule),
  evaluation every 10 rounds with the probes on (500 class-balanced test images), one torch thread.

Learning-rate rule, per (model, E, method) for FedAvg and FedDr+, on seed 0 only:
- A grid of three points on the half-decade ladder … 0.03, 0.1, 0.3, 1, 3, 10, 30 …, centred on the
  teaching model's default (``results/lr_grid.csv``, chosen at s = 5 and 120 rounds): FedAvg
  {0.03, 0.1, 0.3}, FedDr+ {1, 3, 10}. The default is not reused as it stands in any cell, ``cnn_bn`` at
  E = 1 included: it was chosen at another s and length, and one rule for every cell keeps the cells
  comparable.
- The measure is ``late_acc``: the mean test accuracy of the last three evaluations (rounds 60, 70, 80).
  A diverged run ranks last. The highest wins; an exact tie goes to the smaller lr.
- Bracketing: while the winner is the largest (smallest) point run, the next ladder point above
  (below) is run, at most two extra points each way. The winner after that is the cell's lr.
- The control is not tuned: its lr is β times FedDr+'s chosen lr, by its definition.

Seeds: the verdicts use seeds 1, 2 and 3 at the chosen lrs, never seed 0. The chosen lr's seed-0 run
is the best of its grid; counting it would favour the two tuned methods over the untuned control.
Every method sees the same partition and the same clients in the same rounds under one seed, so
differences are paired by seed (also across cells: seed s has the same partition in every cell).

Measures, per run, from its history (``results/drift_probe_history.csv``):
- ``late_acc`` (above) and ``final_acc`` (round 80);
- drift, each the mean over the run's eight evaluated rounds of the round's sampled clients' values:
  ``weight_change`` (‖θ_local − θ_global‖ / ‖θ_global‖ of the feature extractor after local training),
  ``acc_unobs`` and ``align_unobs`` (the local models on the classes they never saw),
  ``forgetting_unobs`` = ``global_acc_unobs`` − ``acc_unobs`` (the paper's local-minus-global measure,
  sign flipped so that more forgetting is larger), ``grad_ratio_features`` (FD:DR gradient ratio, FedDr+
  only) and ``feature_norm`` (the global model's).

Comparisons (95 % paired t intervals over seeds 1-3; ``fk.stats.verdict``; margin 0.5 pp for
accuracies, 0 for ``weight_change``):
- C1, per cell: FedDr+ − FedAvg in ``late_acc``, expected greater (the paper's claim).
- C2, per cell: FedDr+ − control in ``late_acc``, expected greater (FD, not the smaller step).
- C3, per cell: FedDr+ − control in ``acc_unobs``, expected greater (FD keeps the unseen classes).
- C4, FedAvg's drift, per model, E = 5 − E = 1: ``weight_change`` expected greater (margin 0) and
  ``forgetting_unobs`` expected greater (margin 0.5 pp). A manipulation check: if more local epochs do
  not drift more, the epochs axis says nothing about drift. FedAvg's drift measures in every cell are
  also tabulated without a verdict.
- C5, interactions on C1's gap g = FedDr+ − FedAvg (``late_acc``), paired by seed: the epochs effect
  g(E = 5) − g(E = 1) per model, and the BatchNorm effect g(cnn_nobn) − g(cnn_bn) per E, each expected
  greater (margin 0.5 pp).

Reading, fixed beforehand:
- C1 held in some cell but not in the teaching cell (``cnn_bn``, E = 1): the teaching setting hides the
  advantage, and C5 names the factor (BatchNorm, epochs, or both).
- C1 not held in any cell: neither BatchNorm nor five local epochs brings the advantage out at this
  model's size; what remains is the model and data scale (a paper-scale GPU run decides) or the method.
- C1 held with C2 / C3 ties: the advantage comes from the smaller step β·lr, not from FD.

Budget: at most 14 core-hours of CPU, estimated at about 11 from the chapters' measured seconds per
round (``cnn_bn`` at s = 2: FedAvg and DR 1.9 s, FedDr+ 2.8 s per one-epoch round on one thread): 24
grid runs (more if a grid extends) and 36 evaluation runs, 60 in all. Order: every grid first, then
seed-major (seed 1 of every cell, then 2, then 3), cells in the order (cnn_nobn, E = 5) (nearest the
paper), (cnn_bn, E = 1) (the teaching setting), (cnn_bn, E = 5), (cnn_nobn, E = 1), methods FedDr+,
FedAvg, control. If the budget runs short, cells are cut whole, last first: (cnn_nobn, E = 1), then
(cnn_bn, E = 5); a kept cell always has three seeds. The cut, if any, is stated with the results.

AMENDMENT, 2026-11-28 (committed before any run after it; the design, the lr rule, the seeds, the measures,
the comparisons, the margins and the reading above stay exactly as they are).

- What had been seen. The five grid runs of (cnn_nobn, E = 5) on seed 0: FedDr+ at 3 and 10 and FedAvg at
  0.1 and 0.3 diverged in round 1; FedAvg at 0.03 finished with late accuracy 32.0 %. No run of another cell
  and no verdict run. The probe was then stopped because the 14 core-hours above could not hold
  (cnn_nobn, E = 5) alone. That estimate rested on timing under load: 60.2 s per round, the median of the one
  finished FedAvg run, which ran beside a second probe process, lr-grid runs and CI (its evaluated rounds
  took 29.8 to 171.3 s). The stop was no part of this plan, and it is withdrawn here.
- Idle timing (``benchmarks/drift_probe_timing.py``, rows in ``results/drift_probe_timing.csv``; this 2-core
  machine with nothing else running; two training rounds of each cell's own config, s per round):
      cell, method           alone, 1 thread   alone, 2 threads   1 thread, beside a second 1-thread process
      (cnn_bn, E = 1)   FedAvg      4.8             3.4             4.8, 4.9 (the two processes)
      (cnn_bn, E = 1)   FedDr+      7.0             5.2             6.6, 7.2
      (cnn_nobn, E = 1) FedAvg      5.2             3.5             4.5, 4.6
      (cnn_nobn, E = 1) FedDr+      6.2             4.2             6.9, 7.2
      (cnn_nobn, E = 5) FedAvg     26.0            14.8            23.8
      (cnn_nobn, E = 5) FedDr+     36.2            23.7             —
      (cnn_bn, E = 5)   FedAvg     26.8             —               —
      (cnn_bn, E = 5)   FedDr+     34.4             —               —
  Two processes side by side, one thread each, each kept about its pace alone (0.86-1.15 ×), so the pair
  does about twice the rounds per hour of one process. One process on two threads did 1.3-1.8 × the rounds
  of one thread alone, and beside a busy one-thread process it fell to 10.9 s a round (``cnn_bn``, E = 1,
  FedAvg: 2.3 × slower than one thread alone), while its neighbour slowed to 6.3-9.3 s. So the probe runs
  as two processes side by side, one torch thread each (``PROCESSES``); the earlier note that two
  processes each run at half speed was measured with other work on the machine and does not hold idle.
  The budget's pace is the one-thread pace alone, and a run's wall seconds count 1/2 of a machine-hour each.
- Order: cell by cell, cheapest first. (cnn_bn, E = 1) and (cnn_nobn, E = 1) first: they answer
  the BatchNorm question at one epoch (C1 in both, C5's BatchNorm effect at E = 1). Then (cnn_nobn, E = 5),
  nearest the paper, then (cnn_bn, E = 5). Within a cell: its grid runs, then its verdict seeds 1, 2, 3
  (FedDr+, FedAvg, control each). Each process takes the first run in this order that can start and that no
  other process holds, so the next cell's grid runs start only when every startable run before them is
  taken. Ordering by cost cannot favour a verdict.
- Budget: 25 machine-hours from this amendment on, carried from one working day to the next, counted as the
  recorded wall seconds of the runs finished after it, halved for the two processes
  (``results/drift_report.py``). At the idle pace the
  runs left need at least 10.5 machine-hours before evaluations and any grid point the rule adds. If the
  budget runs out, the last cell in this order is cut whole, as the original plan cuts; a kept cell always
  has its three seeds. Each cell's verdicts are read as soon as its three seeds are in; the pre-registered
  reading waits for every kept cell.
- Engine settings of every run after the amendment, the same as the five before it: the kit's serial engine
  on the CPU, float32, PyTorch's default (NCHW) memory layout, one torch thread per process (each run's
  config.json records the engine, layout and precision; the CSV's ``machine`` column the threads). The probe
  keeps them to its end even if the kit's CPU step gets a faster layout, so that no two verdict runs differ
  in their rounding.
- Runs carried across working days: ``--pause`` stops each probe process (SIGSTOP) just after its run writes
  a checkpoint (every 10 rounds). The checkpoints of the probe's unfinished runs are committed
  (``.gitignore`` keeps them), and the next day's probe resumes from them through the kit's exact resume; a
  run's checkpoint is deleted when it finishes. ``tests/test_drift_probe.py`` checks that a paused, killed
  and restarted probe gives the histories of an uninterrupted one.
- Bracketing limit: the rule stays as written (``MAX_EXTRA`` = 2 ladder points beyond each end of a grid);
  it does not extend further. A run *trains* if its late accuracy is at least 20 % (twice chance). If the
  lr the rule chooses for a method did not train on seed 0, that method has no working lr in the cell: its
  verdict runs (for FedDr+, the control's too) are not run, and every comparison that needs it reads
  "no working lr found by the rule", a statement about the rule's range at that setting, not a verdict on
  the method. In (cnn_nobn, E = 5) FedDr+'s grid can still reach 1, 0.3 and 0.1, FedAvg's 0.01 and 0.003.
- Wording: "a difference between the two models is BatchNorm's" above means BatchNorm together with what
  replaces it in ``cnn_nobn``: the convolutions' bias and their He-normal (fan-out) initialisation. The two
  models differ in those three things at once, and the probe cannot separate them.

    FEDDR_DATA_DIR=../shared/data OMP_NUM_THREADS=1 nohup python results/drift_probe.py &   # twice:
    FEDDR_DATA_DIR=../shared/data OMP_NUM_THREADS=1 nohup python results/drift_probe.py &   # two processes
    python results/drift_probe.py --status        # what has finished, the chosen lrs
    python results/drift_probe.py --pause         # stop just after the next checkpoint; commit it; --continue
    python results/drift_probe.py --collect-only  # rewrite the CSVs from the run folders

Runs go to ``results/runs/drift_probe/<model>__E=<E>/<method>__lr=<lr>/seed=<s>/`` (resumable; two
processes share the work through the runs' locks). The CSVs: ``results/drift_probe.csv`` (one row per
finished run) and ``results/drift_probe_history.csv`` (one row per run and evaluated round).
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from filelock import FileLock  # installed with torch

import feddr_kit as fk

RESULTS = Path(__file__).resolve().parent
ROOT = RESULTS / "runs" / "drift_probe"
OUT, HISTORY_OUT = RESULTS / "drift_probe.csv", RESULTS / "drift_probe_history.csv"

BASE = {"dataset": "cifar10", "partition": "shard", "shards_per_client": 2, "num_clients": 100,
        "clients_per_round": 10, "batch_size": 50, "rounds": 80, "eval_every": 10, "probes": True,
        "beta": 0.9, "checkpoint_every": 10, "channels_last": False}
CELLS = [("cnn_bn", 1), ("cnn_nobn", 1), ("cnn_nobn", 5), ("cnn_bn", 5)]  # the amended order: cheapest first, cut last first
TUNED = ["feddr+", "fedavg"]
METHODS = [*TUNED, "control"]
LADDER = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0]
CENTRE = {"fedavg": 0.1, "feddr+": 3.0}
MAX_EXTRA = 2  # ladder points added beyond each end of a grid
GRID_SEED, EVAL_SEEDS = 0, (1, 2, 3)
LATE_EVALUATIONS = 3
TRAINS = 0.20  # the amendment's "a run that trains": late accuracy at least twice chance (10 classes)
BUDGET_MACHINE_HOURS = 25.0  # the amended budget, counted from the amendment on
PROCESSES = 2  # probe processes side by side, one torch thread each: a run holds half the machine (the amendment)
# The runs that had finished when the amendment was written: the budget counts the runs after them.
BEFORE_AMENDMENT = {("cnn_nobn", 5, "fedavg", 0.03, 0), ("cnn_nobn", 5, "fedavg", 0.1, 0),
                    ("cnn_nobn", 5, "fedavg", 0.3, 0), ("cnn_nobn", 5, "feddr+", 3.0, 0), ("cnn_nobn", 5, "feddr+", 10.0, 0)}
RUNNING = "running"  # in ROOT: one file per probe process, named by its pid, holding the folder of its run
DRIFT = ["weight_change", "acc_unobs", "align_unobs", "forgetting_unobs", "grad_ratio_features", "feature_norm"]


def cell_name(model: str, epochs: int) -> str:
    return f"{model}__E={epochs}"


@dataclass(frozen=True)
class Item:
    """One run of the probe: a cell, a method, an lr and a seed."""

    model: str
    epochs: int
    method: str
    lr: float
    seed: int

    @property
    def root(self) -> Path:
        return ROOT / cell_name(self.model, self.epochs) / f"{self.method}__lr={self.lr:g}"

    @property
    def folder(self) -> Path:
        return self.root / f"seed={self.seed}"

    def config(self) -> fk.Config:
        cfg = fk.Config(**BASE, model=self.model, local_epochs=self.epochs, seed=self.seed, progress=False)
        if self.method == "control":  # the lr is already β × FedDr+'s; beta_scaled_dr multiplies it in again
            return fk.federated.beta_scaled_dr(cfg.replace(algorithm="feddr+", lr=round(self.lr / BASE["beta"], 12)))
        return cfg.replace(algorithm=self.method, lr=self.lr)


def late_acc(history: pd.DataFrame) -> float:
    """Mean ``test_acc`` of the last :data:`LATE_EVALUATIONS` evaluated rounds."""
    return float(history["test_acc"].tail(LATE_EVALUATIONS).mean())


def score(item: Item) -> float | None:
    """The lr rule's measure of a finished run (``-inf`` for a failed one), or None while it is not finished."""
    if (item.folder / "summary.json").exists():
        return late_acc(pd.read_csv(item.folder / "history.csv"))
    if (item.folder / "error.txt").exists():
        return -math.inf
    return None


def grid_points(method: str, model: str, epochs: int) -> tuple[list[float], float | None]:
    """The lrs to run on seed 0 for ``method`` in a cell as far as the finished runs decide them, and the
    chosen lr (None until the bracketing rule has settled)."""
    i = LADDER.index(CENTRE[method])
    lo, hi = i - 1, i + 1
    while True:
        points = LADDER[lo:hi + 1]
        scores = [score(Item(model, epochs, method, lr, GRID_SEED)) for lr in points]
        if any(s is None for s in scores):
            return points, None
        best = max(range(len(points)), key=lambda k: (scores[k], -k))  # ties: the smaller lr
        if best == len(points) - 1 and hi < i + 1 + MAX_EXTRA and hi + 1 < len(LADDER):
            hi += 1
        elif best == 0 and lo > i - 1 - MAX_EXTRA and lo > 0:
            lo -= 1
        else:
            return points, points[best]


def chosen_lr(method: str, model: str, epochs: int) -> float | None:
    """The lr of ``method`` in a cell by the rule (the control: β × FedDr+'s), or None while undecided."""
    if method == "control":
        lr = grid_points("feddr+", model, epochs)[1]
        return None if lr is None else lr * BASE["beta"]
    return grid_points(method, model, epochs)[1]


def trains(method: str, model: str, epochs: int) -> bool | None:
    """Whether ``method``'s chosen lr in a cell trains (its seed-0 grid run's late accuracy is at least
    :data:`TRAINS`; the control's is FedDr+'s), or None while the lr is undecided. A cell's comparisons
    with a method that does not train read "no working lr found by the rule", and its verdict runs are
    not run."""
    tuned = "feddr+" if method == "control" else method
    lr = grid_points(tuned, model, epochs)[1]
    if lr is None:
        return None
    measure = score(Item(model, epochs, tuned, lr, GRID_SEED))
    return measure is not None and measure >= TRAINS


def plan() -> tuple[list[Item], int]:
    """The runs that can start now, in the amended order (cell by cell, cheapest first: a cell's grids,
    then its verdict seeds, seed by seed), and how many runs are still undecided (their lr waits on grid
    runs that have not finished)."""
    items, undecided = [], 0
    for model, epochs in CELLS:
        for method in TUNED:
            points, _ = grid_points(method, model, epochs)
            items += [Item(model, epochs, method, lr, GRID_SEED) for lr in points]
        for seed in EVAL_SEEDS:
            for method in METHODS:
                lr, works = chosen_lr(method, model, epochs), trains(method, model, epochs)
                if lr is None:
                    undecided += 1
                elif works:
                    items.append(Item(model, epochs, method, lr, seed))
    return items, undecided


def finished(item: Item) -> bool:
    return (item.folder / "summary.json").exists() or (item.folder / "error.txt").exists()


def run_item(item: Item, data) -> None:
    """Run (or resume) one item through the kit's sweep runner, under the folder's lock: a folder that
    another process holds is skipped."""
    # The base is what differs from the defaults, less the seed: the same for every seed of a root, so
    # the runner sees one grid there, and unchanged by fields the kit may add with their defaults.
    defaults = fk.Config().to_dict()
    base = {k: v for k, v in item.config().to_dict().items() if k != "seed" and v != defaults.get(k)}
    fk.sweep.run(base, {}, [item.seed], item.root, data=data, progress=False)
    drop_finished_checkpoints([item])


def drop_finished_checkpoints(items: list[Item]) -> None:
    """Delete the checkpoints of the finished runs among ``items`` (a summary, or a divergence's error.txt): a
    checkpoint is carried (committed) only while its run is unfinished. A run paused just after its last
    checkpoint may have written its summary before it stopped, so the probe also looks again at its start."""
    for it in items:
        if finished(it):
            (it.folder / fk.rundir.CHECKPOINT).unlink(missing_ok=True)


def work(data, wait: float = 60.0) -> None:
    """Run the plan until every run has finished, sharing it with other processes through the locks."""
    drop_finished_checkpoints(plan()[0])
    while True:
        items, undecided = plan()
        todo = [it for it in items if not finished(it)]
        if not todo and not undecided:
            return
        for it in todo:
            if (it.folder / ".lock").exists() and _held(it.folder):
                continue
            t0 = time.time()
            print(f"{time.strftime('%H:%M:%S')} {it}", flush=True)
            fk.rundir.write_text(ROOT / RUNNING / str(os.getpid()), f"{it.folder}\n")
            run_item(it, data)
            fk.rundir.write_text(ROOT / RUNNING / str(os.getpid()), "")
            print(f"  {'finished' if finished(it) else 'left to another process'} in {time.time() - t0:.0f} s",
                  flush=True)
            collect()
            break
        else:  # everything startable is held by another process, or waits on grid runs they are running
            time.sleep(wait)


def _held(folder: Path) -> bool:
    """Whether another process holds ``folder``'s run lock now."""
    try:
        with fk.rundir.claim(folder, resume=True, overwrite=False):
            return False
    except fk.errors.BusyError:
        return True


def run_rows(item: Item) -> tuple[dict, pd.DataFrame]:
    """One finished run's CSV row (the cell, the method, its role, the summary and the drift means) and
    its history with the identifying columns."""
    key = {"model": item.model, "local_epochs": item.epochs, "method": item.method, "lr": item.lr,
           "seed": item.seed, "role": "grid" if item.seed == GRID_SEED else "evaluation"}
    if (item.folder / "error.txt").exists():
        return {**key, "status": "failed"}, pd.DataFrame()
    summary = fk.rundir.read_json(item.folder / "summary.json", "drift probe")
    history = pd.read_csv(item.folder / "history.csv")
    if {"global_acc_unobs", "acc_unobs"} <= set(history):
        history["forgetting_unobs"] = history["global_acc_unobs"] - history["acc_unobs"]
    row = {**key, "status": "done", "final_acc": summary["final_acc"], "late_acc": late_acc(history),
           **{c: float(history[c].mean()) if c in history else float("nan") for c in DRIFT},
           "sec_per_round": summary["sec_per_round"], "total_seconds": summary["total_seconds"]}
    return row, history.assign(**key)


def collect() -> pd.DataFrame:
    """Rewrite the two CSVs from every finished run of the plan; returns the run table."""
    items, _ = plan()
    rows, hists = [], []
    for it in dict.fromkeys(items):
        if finished(it):
            row, hist = run_rows(it)
            rows.append(row)
            hists.append(hist)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table = table.assign(machine=f"{platform.machine()} {os.cpu_count()} cores, 1 torch thread per run")
    with FileLock(str(OUT) + ".lock"):
        fk.rundir.write_text(OUT, table.to_csv(index=False))
        hists = [h for h in hists if not h.empty]  # a diverged run has a row but no history
        hist = pd.concat(hists, ignore_index=True) if hists else pd.DataFrame()
        fk.rundir.write_text(HISTORY_OUT, hist.to_csv(index=False))
    return table


def status() -> str:
    """The chosen lrs and how many runs have finished."""
    items, undecided = plan()
    done = sum(finished(it) for it in items)
    lines = [f"drift probe: {done} of {len(items) + undecided} runs finished ({undecided} wait on a grid)"]
    for model, epochs in CELLS:
        lrs = {m: chosen_lr(m, model, epochs) for m in METHODS}
        lines.append(f"  {cell_name(model, epochs)}: " + ", ".join(f"{m} lr={'?' if v is None else f'{v:g}'}"
                                                                   for m, v in lrs.items()))
    return "\n".join(lines)


def probes_running() -> dict[int, Path | None]:
    """The probe processes alive now (from ``ROOT/running/``), each with the folder of the run it is on (None
    between runs); files of processes that have ended are removed."""
    running = {}
    for path in sorted((ROOT / RUNNING).glob("*")):
        pid = int(path.name)
        try:
            os.kill(pid, 0)
        except OSError:
            path.unlink(missing_ok=True)
            continue
        text = path.read_text().strip()
        running[pid] = Path(text) if text else None
    return running


def pause(poll: float = 0.2, timeout: float = 3600.0) -> str:
    """Stop every running probe process (SIGSTOP) just after its run writes its next checkpoint, so that
    committing the checkpoints carries every finished round to the next working day; a process between runs
    stops at once. Returns what it did, a line per process. ``--continue`` (SIGCONT) lets them go on."""
    running = probes_running()
    if not running:
        raise SystemExit(f"drift_probe: no running probe (nothing alive in {ROOT / RUNNING})")
    def stamp(folder: Path) -> int | None:  # the checkpoint's time; None once a finished run's is deleted
        try:
            return (folder / fk.rundir.CHECKPOINT).stat().st_mtime_ns
        except FileNotFoundError:
            return None

    seen = {pid: stamp(folder) for pid, folder in running.items() if folder is not None}
    lines, deadline = [], time.time() + timeout
    for pid, folder in running.items():
        if folder is None:
            os.kill(pid, signal.SIGSTOP)
            lines.append(f"paused probe process {pid} between runs")
    while seen:
        for pid in [pid for pid in seen if stamp(running[pid]) != seen[pid]]:
            os.kill(pid, signal.SIGSTOP)
            del seen[pid]
            folder = running[pid]
            try:
                done = torch.load(folder / fk.rundir.CHECKPOINT, weights_only=False, map_location="cpu")["next_round"]
                lines.append(f"paused probe process {pid} just after its checkpoint at round {done} of {folder}")
            except FileNotFoundError:  # the run's last checkpoint came, and the run finished before the stop
                lines.append(f"paused probe process {pid} just after it finished its run in {folder}")
        if seen and time.time() > deadline:
            raise SystemExit(f"drift_probe: no new checkpoint within {timeout:.0f} s in "
                             f"{', '.join(str(running[pid]) for pid in seen)}; those processes go on")
        time.sleep(poll)
    return "\n".join(lines + ["commit the unfinished runs' checkpoints to carry them; --continue lets the probe go on"])


def go_on() -> str:
    """Let every paused probe process go on (SIGCONT); returns a line."""
    running = probes_running()
    for pid in running:
        os.kill(pid, signal.SIGCONT)
    return f"{len(running)} probe process(es) go on" if running else "drift_probe: no probe process to continue"


TINY = {"dataset": "synthetic", "rounds": 4, "eval_every": 2, "num_clients": 10, "clients_per_round": 2,
        "probe_samples": 40, "checkpoint_every": 2}


def main(argv: list[str] | None = None) -> None:
    """The command line: run the probe (or ``--status``, ``--collect-only``); ``--tiny`` runs the whole plan
    on a few rounds of synthetic data into ``--root`` with its CSVs there (a smoke test of the machinery)."""
    global ROOT, OUT, HISTORY_OUT, TRAINS
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--status", action="store_true", help="print the chosen lrs and the progress, and stop")
    p.add_argument("--collect-only", action="store_true", help="only rewrite the CSVs from the run folders")
    p.add_argument("--tiny", action="store_true", help="synthetic data, 4 rounds, 10 clients: a smoke test (needs --root)")
    p.add_argument("--root", help="where the run folders go (default results/runs/drift_probe); with --tiny the "
                   "CSVs go there too")
    p.add_argument("--pause", action="store_true", help="stop every running probe process (SIGSTOP) just after its "
                   "run's next checkpoint, so that committing the checkpoints carries the runs; prints which runs")
    p.add_argument("--continue", dest="resume", action="store_true", help="let paused probe processes go on (SIGCONT)")
    args = p.parse_args(argv)
    if args.tiny and not args.root:
        raise SystemExit("drift_probe: --tiny needs --root, so that its runs never mix with the probe's")
    if args.root:
        ROOT = Path(args.root)
    if args.tiny:
        BASE.update(TINY)
        TRAINS = -math.inf  # four rounds of synthetic data train nothing: every lr "trains", so every run of the plan runs
        OUT, HISTORY_OUT = ROOT / "drift_probe.csv", ROOT / "drift_probe_history.csv"
    if args.status:
        print(status())
        return
    if args.pause or args.resume:
        print(pause() if args.pause else go_on())
        return
    if not args.collect_only:
        torch.set_num_threads(1)
        (ROOT / RUNNING).mkdir(parents=True, exist_ok=True)
        try:
            work(fk.data.load(BASE["dataset"]))
        finally:
            (ROOT / RUNNING / str(os.getpid())).unlink(missing_ok=True)
    collect()
    print(status())


if __name__ == "__main__":
    main()
