"""The paper's CIFAR-10 table (Table 3: VGG-11, real CIFAR-10) cell by cell at the paper's scale, a GPU lease at a time.

The paper's protocol (:data:`PAPER_SCALE`: 100 clients, 10 per round, 320 rounds, E = 10, batch 50, SGD with
momentum 0.9 and weight decay 1e-5, the lr ×0.1 at rounds 160 and 240, each method at the reference code's
initial lr for VGG-11, the algorithms' ``default_lr``), in priority order (:func:`groups`):

1. s = 2: FedAvg and FedDr+, seeds 0-2;
2. s = 2: DR, and DR at FedDr+'s lr × β (``fk.federated.beta_scaled_dr``, the control that tells feature
   distillation from a smaller step);
3. s = 2: FedETF, SphereFed, SCAFFOLD;
4. s = 5 and α = 0.1: FedAvg and FedDr+.

``--budget SECONDS`` starts only the runs that can finish inside it: each run costs its rounds times the
measured seconds per round (``--sec-per-round``, else the ``--timing`` CSVs or ``round_time_<gpu>.csv`` of
this GPU for the engine settings in :data:`ENGINE`, else a timed three-round run, announced, stopped when the
budget runs out, and paid out of the budget like the data's loading), and ``--jobs N`` runs them side by
side, each slowed as measured (:data:`SIDE_BY_SIDE`). Runs go to
``results/paper_scale/<setting>/<group>/<run>/`` through ``fk.sweep.run``: finished runs are skipped,
so the next lease continues with the next ones. ``--export DIR`` copies each run as it finishes, without
its checkpoint, with ``machines.json`` (the GPU each run used) and ``paper_scale.csv``, to where a lease
brings files back.

    python results/paper_scale.py --budget 480 --jobs 3 --export "$OUT/paper_scale"   # on a lent GPU
    python results/paper_scale.py --status                                             # runs done of planned
    cp -r <fetched>/paper_scale/. results/paper_scale/ && python results/paper_scale.py --collect-only
    python results/paper_scale.py --tiny --budget 60                                   # CPU smoke test

``--collect-only`` rewrites ``results/paper_scale/paper_scale.csv`` (one row per finished run) and
``docs/paper_scale.md`` (each cell beside the paper's, the two questions answered as far as the runs go);
with another ``--root``, the root's own ``paper_scale.md`` instead (``--doc`` names another page).
Commit the finished runs with ``git add results/paper_scale docs/paper_scale.md``; checkpoints and locks
are ignored. Exit codes as ``python -m feddr_kit``'s: 0 done, 1 a run's process was lost (killed, out of
memory), 2 bad input or an unreadable run file (one line naming it), 3 a result file could not be written,
130 Ctrl-C (finished runs kept, folders released).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import math
import os
import re
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import feddr_kit as fk  # noqa: E402
from _sweeps import slug  # noqa: E402
from feddr_kit.errors import FeddrKitError, report  # noqa: E402
from feddr_kit.rundir import CHECKPOINT, read_csv, read_json, write_json, write_text  # noqa: E402

RESULTS = Path(__file__).resolve().parent
ROOT = RESULTS / "paper_scale"
DOC = RESULTS.parent / "docs" / "paper_scale.md"
TINY_ROOT = RESULTS.parent / "runs" / "paper_scale_tiny"
CSV, MACHINES, PAGE = "paper_scale.csv", "machines.json", "paper_scale.md"
WHO = "paper_scale"  # how the recipe's one-line errors begin

# The paper's CIFAR-10 runs (spec §0; the paper's appendix table of settings). lr is each algorithm's
# default for VGG-11, the reference code's (0.01 for the CE methods, 0.35 FedDr+ and DR, 0.55 SphereFed,
# 0.05 FedETF). Evaluated every 5th round: the best accuracy is over those rounds.
PAPER_SCALE: dict[str, Any] = dict(dataset="cifar10", model="vgg11", num_clients=100, clients_per_round=10, rounds=320,
                                   local_epochs=10, batch_size=50, lr_decay_at=(0.5, 0.75), lr_gamma=0.1, momentum=0.9,
                                   weight_decay=1e-5, beta=0.9, eval_every=5)
# --tiny: the same plan at CPU cost, on synthetic data (NOT real images: a smoke test of the recipe only).
TINY_SCALE: dict[str, Any] = dict(PAPER_SCALE, dataset="synthetic", model="cnn", num_clients=10, clients_per_round=3,
                                  rounds=2, local_epochs=1, eval_every=1)
# How the runs train: the batched engine without deterministic kernels (2.1 s instead of 4.8 s per VGG-11 FedDr+
# round on an H100, README), fp32 with the kit's default TF32; a checkpoint only at the end, since a lease does not
# bring one back. Fixed for the root's life (a run folder holding other settings is refused): change it, after
# a lease's timings, only before the first run is committed.
ENGINE: dict[str, Any] = dict(engine="batched", deterministic=False, checkpoint_every=0)
SETTINGS: dict[str, dict[str, Any]] = {"s=2": dict(partition="shard", shards_per_client=2),
                                       "s=5": dict(partition="shard", shards_per_client=5),
                                       "α=0.1": dict(partition="dirichlet", alpha=0.1)}
SEEDS = [0, 1, 2]
# Per-run slowdown when c runs share one GPU (VGG-11 FedDr+, batched, bf16, nondeterministic, on an H100: one
# alone 2.42 s per round, three at once 4.12 s each, four at once 4.8-5.6 s each on real CIFAR-10). A count not
# measured is assumed to gain nothing (c runs side by side take c times as long each).
SIDE_BY_SIDE = {1: 1.0, 3: 4.12 / 2.42, 4: 5.6 / 2.42}
# A measured round leaves out the evaluations (every 5th round) and the end of a run; 10 % covers them.
OVERHEAD = 1.1
PAPER_KEYS = {"FedAvg": "fedavg", "FedDr+": "feddr+", "FedETF": "fedetf", "SphereFed": "spherefed",
              "SCAFFOLD": "scaffold"}  # the cells that Table 3 has (DR and its control are not in it)


@dataclass(frozen=True)
class Group:
    """Runs that share one sweep root, ``<setting>/<name>``: the setting's fields and ``base``, with ``field`` taking
    the value of each cell (``cells``: label → value), for every seed."""

    setting: str
    name: str
    base: dict
    field: str
    cells: dict

    def config_base(self, scale: dict) -> dict:
        return {**scale, **ENGINE, **SETTINGS[self.setting], **self.base}

    def grid(self) -> dict:
        return {self.field: list(self.cells.values())}

    def root(self, root: Path) -> Path:
        return root / slug(self.setting) / self.name

    def folders(self, root: Path, scale: dict, seed: int) -> list[tuple[str, fk.Config, Path]]:
        """``(cell label, config, folder)`` of each of the group's runs at ``seed``, in the cells' order."""
        base = self.config_base(scale)
        configs = fk.sweep.expand(base, self.grid(), [seed])
        return [(label, cfg, self.root(root) / fk.sweep.run_dir_name(cfg, base, self.grid()))
                for label, cfg in zip(self.cells, configs)]


def groups(scale: dict) -> list[Group]:
    """The plan's groups in priority order (module docstring). The control's lr is ``beta_scaled_dr``'s, taken from
    FedDr+'s own lr at this scale; DR's is its default, named so that both runs vary the same field."""
    feddr = fk.Config(**{**scale, **SETTINGS["s=2"], "algorithm": "feddr+"})
    control = fk.federated.beta_scaled_dr(feddr)
    dr_lr = fk.federated.initial_lr(feddr.replace(algorithm="dr", regularizer="none"))
    pair = {"FedAvg": "fedavg", "FedDr+": "feddr+"}
    return [Group("s=2", "fedavg_feddr+", {}, "algorithm", pair),
            Group("s=2", "dr_control", {"algorithm": "dr", "regularizer": "none"}, "lr",
                  {"DR": dr_lr, "DR at lr·β (control)": control.lr}),
            Group("s=2", "baselines", {"scaffold_zero_head_grad": True}, "algorithm",  # SCAFFOLD as the paper's code
                  {"FedETF": "fedetf", "SphereFed": "spherefed", "SCAFFOLD": "scaffold"}),
            Group("s=5", "fedavg_feddr+", {}, "algorithm", pair),
            Group("α=0.1", "fedavg_feddr+", {}, "algorithm", pair)]


# --------------------------------------------------------------------------- what fits in a budget
@dataclass
class Unit:
    """One group's runs at one seed: the planning step (a sweep call takes whole units). ``seconds``: each pending
    run's estimated seconds when it runs alone."""

    group: int
    seed: int
    seconds: list[float]


def side_by_side(c: int) -> float:
    """Each run's slowdown when ``c`` share the GPU (:data:`SIDE_BY_SIDE`; ``c`` where not measured)."""
    return SIDE_BY_SIDE.get(c, float(c))


def calls(units: list[Unit]) -> list[list[Unit]]:
    """``units`` as sweep calls: consecutive units of one group go together (their seeds in one call)."""
    out: list[list[Unit]] = []
    for u in units:
        if out and out[-1][-1].group == u.group:
            out[-1].append(u)
        else:
            out.append([u])
    return out


def plan_seconds(units: list[Unit], jobs: int) -> float:
    """Estimated wall seconds of ``units``, call after call, each call's runs ``min(jobs, runs)`` at a time."""
    total = 0.0
    for call in calls(units):
        runs = [s for u in call for s in u.seconds]
        if runs:
            c = min(jobs, len(runs))
            total += math.ceil(len(runs) / c) * max(runs) * side_by_side(c)
    return total


def plan(units: list[Unit], budget_s: float, jobs: int) -> list[Unit]:
    """The longest prefix of ``units`` (priority order) that fits in ``budget_s``: nothing is started that could
    not finish, and no later unit jumps ahead of one that does not fit."""
    chosen: list[Unit] = []
    for u in units:
        if plan_seconds(chosen + [u], jobs) > budget_s:
            break
        chosen.append(u)
    return chosen


def pending_units(root: Path, scale: dict, seeds: list[int], seconds_of: Callable[[fk.Config], float]) -> list[Unit]:
    """Every (group, seed) with a run not finished, in priority order; ``seconds_of(cfg)``: a run's estimate."""
    out = []
    for i, g in enumerate(groups(scale)):
        for seed in seeds:
            todo = [seconds_of(cfg) for _, cfg, folder in g.folders(root, scale, seed)
                    if not (folder / fk.sweep.SUMMARY).exists()]
            if todo:
                out.append(Unit(i, seed, todo))
    return out


# --------------------------------------------------------------------------- seconds per round
def device_name() -> str:
    return fk.engine.device_name(fk.engine.resolve_device("auto"))


def engine_label(options: dict) -> str:
    """The name the timing CSVs give a configuration of the kit's engine (``benchmarks/gpu_check.py``,
    ``benchmarks/paper_scale_lease.py``): ``batched``, then ``+bf16``, ``+channels_last``, ``+fused_sgd``,
    ``+tf32_off``, ``+nondeterministic`` for each one set away from its default."""
    label = options.get("engine", "batched")
    for name, suffix in (("precision", "+bf16"), ("channels_last", "+channels_last"), ("fused_sgd", "+fused_sgd")):
        if options.get(name) not in (None, False, "fp32"):
            label += suffix
    if options.get("tf32") is False:
        label += "+tf32_off"
    if options.get("deterministic") is False:
        label += "+nondeterministic"
    return label


def measured_seconds(csvs: list[Path], device: str, model: str, label: str) -> dict[str, float]:
    """Seconds per round by algorithm from the timing CSVs (columns device, model, algorithm, engine,
    sec_per_round) for this device, model and engine label; a later file wins."""
    out: dict[str, float] = {}
    for path in csvs:
        if not path.is_file():
            continue
        df = pd.read_csv(path)
        rows = df[(df["device"] == device) & (df["model"] == model) & (df["engine"] == label)]
        out.update({r.algorithm: float(r.sec_per_round) for r in rows.itertuples()})
    return out


TIMED_ROUNDS = 3


class OutOfBudget(Exception):
    """The budget ran out before the recipe finished measuring: no run can fit in what is left."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise :class:`OutOfBudget` inside the block once ``seconds`` have passed (a SIGALRM timer, so that a timing
    round on a slow machine stops at the budget's end instead of running minutes past it). No limit for an infinite
    ``seconds``, off the main thread or without SIGALRM (signals reach the main thread only)."""
    if not math.isfinite(seconds) or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield
        return
    if seconds <= 0:
        raise OutOfBudget

    def stop(signum, frame):
        raise OutOfBudget

    previous, armed = signal.signal(signal.SIGALRM, stop), time.monotonic()
    outer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer[0] > 0:  # a caller's own timer (a test's time limit, say) goes on with what it had left
            signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.monotonic() - armed), 1e-3), outer[1])


def timed_round(cfg: fk.Config, data, limit_s: float = math.inf) -> float:
    """Median seconds of :data:`TIMED_ROUNDS` rounds of ``cfg`` (no folder): what to plan with where nothing was
    measured. :class:`OutOfBudget` when they take more than ``limit_s`` seconds (then no run of hundreds of such
    rounds could fit either)."""
    with deadline(limit_s):
        result = fk.run(cfg.replace(rounds=TIMED_ROUNDS, eval_every=TIMED_ROUNDS, out_dir=None, progress=False),
                        data=data)
    return float(result.summary["sec_per_round"])


def estimator(args: argparse.Namespace, scale: dict, data,
              time_left: Callable[[], float] = lambda: math.inf) -> Callable[[fk.Config], float]:
    """``seconds_of(cfg)``: a run's estimated seconds alone, ``rounds × seconds per round × OVERHEAD``. A method with
    a teacher (FedDr+) costs what FedDr+ costs, the others what FedAvg costs (the two timed algorithms). Where
    nothing was measured FedDr+ is timed here, said first, within ``time_left()`` seconds (:class:`OutOfBudget`
    past them)."""
    if args.sec_per_round is not None:
        per_round = {"fedavg": args.sec_per_round, "feddr+": args.sec_per_round}
    else:
        slug_ = re.sub(r"[^a-z0-9]+", "_", device_name().lower()).strip("_")
        csvs = [RESULTS / f"round_time_{slug_}.csv", *map(Path, args.timing)]
        per_round = measured_seconds(csvs, device_name(), scale["model"], engine_label(ENGINE))
        if "feddr+" not in per_round:  # the slower one, timed here, stands for both
            cfg = fk.Config(**{**scale, **ENGINE, **SETTINGS["s=2"], "algorithm": "feddr+"})
            left = time_left()
            print(f"{WHO}: no seconds per round measured for {scale['model']} on {device_name()} (engine "
                  f"{engine_label(ENGINE)}; looked in {', '.join(p.name for p in csvs)}): timing {TIMED_ROUNDS} FedDr+ "
                  f"rounds first, out of the budget ({'no limit' if math.isinf(left) else f'{left:.0f} s left'}; "
                  "--sec-per-round or --timing CSV skips this)", flush=True)
            per_round["feddr+"] = timed_round(cfg, data, left)
            print(f"timed: {per_round['feddr+']:.2f} s per FedDr+ round on {device_name()}", flush=True)
        per_round.setdefault("fedavg", per_round["feddr+"])

    def seconds_of(cfg: fk.Config) -> float:
        key = "feddr+" if fk.algorithms.get_algorithm(cfg).needs_teacher else "fedavg"
        return cfg.rounds * per_round[key] * OVERHEAD
    return seconds_of


# --------------------------------------------------------------------------- running and carrying the runs out
def jobs_supported() -> bool:
    """Whether ``fk.sweep.run`` takes ``jobs`` (runs side by side as processes)."""
    return "jobs" in inspect.signature(fk.sweep.run).parameters


def finished(root: Path) -> list[Path]:
    """Every finished run folder under ``root`` (it holds ``summary.json``)."""
    return sorted(p.parent for p in root.glob(f"*/*/*/{fk.sweep.SUMMARY}"))


class Exporter:
    """Records each run as it finishes, every ``every_s`` seconds in a thread until :meth:`stop` (so a lease cut
    short keeps what finished): the GPU it ran on in ``root/machines.json``, ``root/paper_scale.csv``, and, with
    ``export``, a copy of the run's folder without its checkpoint, lock or temp files, with both files."""

    def __init__(self, root: Path, scale: dict, export: Path | None, every_s: float = 10.0):
        self.root, self.scale, self.export, self.every_s = root, scale, export, every_s
        self.machine = {"device": device_name(), "torch": torch.__version__, "engine": engine_label(ENGINE)}
        self._stop, self._warned = threading.Event(), set()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "Exporter":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sweep()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sweep()
            except FeddrKitError as err:  # a run file it cannot read: said once, the runs go on, stop() raises it
                if str(err) not in self._warned:
                    self._warned.add(str(err))
                    print(f"warning: {err}", file=sys.stderr, flush=True)

    def sweep(self) -> None:
        machines_path, machines = self.root / MACHINES, read_machines(self.root)
        new = [p for p in finished(self.root) if p.relative_to(self.root).as_posix() not in machines]
        if not new:
            return
        for run in new:
            machines[run.relative_to(self.root).as_posix()] = self.machine
        write_json(machines_path, dict(sorted(machines.items())))
        write_csv(self.root, self.scale)
        if self.export is not None:
            for run in new:
                shutil.copytree(run, self.export / run.relative_to(self.root), dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns(CHECKPOINT, ".lock", "*.tmp"))
            for name in (MACHINES, CSV):
                shutil.copy2(self.root / name, self.export / name)
        print(f"finished: {', '.join(p.relative_to(self.root).as_posix() for p in new)}", flush=True)


def run_plan(units: list[Unit], scale: dict, root: Path, jobs: int, data) -> None:
    """Run the chosen units, one ``fk.sweep.run`` per call of :func:`calls`, ``min(jobs, runs)`` side by side."""
    all_groups = groups(scale)
    for call in calls(units):
        g = all_groups[call[0].group]
        runs = sum(len(u.seconds) for u in call)
        side = {"jobs": min(jobs, runs)} if jobs_supported() else {}
        fk.sweep.run(g.config_base(scale), g.grid(), [u.seed for u in call], g.root(root), data=data, **side)


# --------------------------------------------------------------------------- the table and the page
COLUMNS = ["setting", "cell", "seed", "algorithm", "lr0", "reported", "best_acc", "best_local_acc", "final_acc",
           "sec_per_round", "device", "run"]


def rows(root: Path, scale: dict, seeds: list[int] = SEEDS) -> pd.DataFrame:
    """One row per finished run: setting, cell, seed, accuracies (fractions), seconds per round, the GPU
    (``machines.json``) and its folder under ``root``. ``reported`` is the number the paper's code reports: the best
    evaluated round of the clients' local-test mean on shards (``best_local_acc``), of the test set on Dirichlet
    (``best_acc``)."""
    machines = read_machines(root)
    out = []
    for g in groups(scale):
        for seed in seeds:
            for label, cfg, folder in g.folders(root, scale, seed):
                if not (folder / fk.sweep.SUMMARY).exists():
                    continue
                summary, best_local = read_run(folder)
                name = folder.relative_to(root).as_posix()
                out.append({"setting": g.setting, "cell": label, "seed": seed, "algorithm": cfg.algorithm,
                            "lr0": summary["lr0"], "best_acc": summary["best_acc"], "best_local_acc": best_local,
                            "reported": best_local if cfg.partition == "shard" else summary["best_acc"],
                            "final_acc": summary["final_acc"], "sec_per_round": summary["sec_per_round"],
                            "device": machines.get(name, {}).get("device"), "run": name})
    return pd.DataFrame(out, columns=COLUMNS)


SUMMARY_KEYS = ("lr0", "best_acc", "final_acc", "sec_per_round")


def read_run(folder: Path) -> tuple[dict, float]:
    """A finished run's ``summary.json`` and the best local-test accuracy in its ``history.csv``; a one-line
    :class:`FeddrKitError` naming the file when either is torn or lacks what the table needs (a copy cut short
    on its way back from a lease, say)."""
    summary_path, history_path = folder / fk.sweep.SUMMARY, folder / fk.sweep.HISTORY
    summary = read_json(summary_path, WHO)
    missing = [k for k in SUMMARY_KEYS if k not in summary] if isinstance(summary, dict) else list(SUMMARY_KEYS)
    if missing:
        raise FeddrKitError(f"{WHO}: {summary_path} is not a finished run's summary (no {', '.join(missing)}); "
                            "copy the run again, or delete its folder to run it again")
    history = read_csv(history_path, WHO)
    if "local_test_acc" not in history.columns:
        raise FeddrKitError(f"{WHO}: {history_path} has no local_test_acc column; copy the run again, or delete its "
                            "folder to run it again")
    return summary, float(history["local_test_acc"].max())


def read_machines(root: Path) -> dict:
    """``root/machines.json`` (run folder → the machine it ran on), ``{}`` before the first run finished; a
    one-line :class:`FeddrKitError` naming it when it is torn."""
    path = root / MACHINES
    machines = read_json(path, WHO) if path.exists() else {}
    if not isinstance(machines, dict):
        raise FeddrKitError(f"{WHO}: {path} is not a JSON object of run folders; restore it from git or an export")
    return machines


def write_csv(root: Path, scale: dict) -> Path:
    path = root / CSV
    write_text(path, rows(root, scale).to_csv(index=False))
    return path


def _mean_std(values: pd.Series) -> str:
    v = 100 * values.to_numpy(dtype=float)
    if len(v) == 0:
        return "not run"
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f} (n={len(v)})" if len(v) > 1 else f"{v[0]:.2f} (n=1)"


def _question(df: pd.DataFrame, a: str, b: str, setting: str = "s=2", margin: float = 0.005) -> str:
    """``a`` against ``b`` in ``setting``: the paired difference of the reported accuracy over the seeds both have,
    its 95 % interval and verdict (``fk.stats``), or why nothing can be said yet."""
    cell = df[df["setting"] == setting]
    x = cell[cell["cell"] == a].set_index("seed")["reported"]
    y = cell[cell["cell"] == b].set_index("seed")["reported"]
    seeds = sorted(set(x.index) & set(y.index))
    if not seeds:
        return f"Not run: no seed has both {a} and {b} at {setting} yet."
    d = fk.stats.difference(x[seeds].to_numpy(), y[seeds].to_numpy(), paired=True)
    verdict = fk.stats.verdict(d, expected="greater", margin=margin)
    return (f"{a} − {b}, reported accuracy, paired over seeds {seeds} (n={d.n}): {100 * d.mean:+.2f} points, "
            f"95 % interval [{100 * d.low:+.2f}, {100 * d.high:+.2f}]; with a margin of {100 * margin:.1f} "
            f"points: **{verdict}**.")


def render_doc(df: pd.DataFrame, scale: dict) -> str:
    """``docs/paper_scale.md`` from :func:`rows`: what was run, each cell beside Table 3, the two questions."""
    paper = fk.paper.table3(list(SETTINGS))
    planned = sum(len(g.cells) for g in groups(scale)) * len(SEEDS)
    devices = sorted(set(df["device"].dropna()))
    status = ("**No paper-scale run has been made yet.** The GPU figures are unmeasured: every cell below says "
              "*not run*, and both questions are open. The runs need a lent GPU (`benchmarks/paper_scale_lease.py`)."
              if df.empty else
              f"**{len(df)} of {planned} planned runs have finished** (on {', '.join(devices) or 'an unrecorded device'}); "
              "a cell with n < 3 does not yet have the paper's three seeds.")
    lines = [
        "# The paper's CIFAR-10 table at the paper's scale",
        "",
        "Generated by `python results/paper_scale.py --collect-only` from the run folders in `results/paper_scale/`",
        "(do not edit by hand).",
        "",
        status,
        "",
        f"Protocol: `{scale['model']}` on `{scale['dataset']}`, {scale['num_clients']} clients, {scale['clients_per_round']} per round, "
        f"{scale['rounds']} rounds, E = {scale['local_epochs']}, batch {scale['batch_size']}, momentum "
        f"{scale['momentum']}, weight decay {scale['weight_decay']:g}, lr ×{scale['lr_gamma']:g} at "
        f"{' and '.join(f'{f:g}' for f in scale['lr_decay_at'])} of the rounds, each method at its default lr "
        f"for the model (for VGG-11 the reference code's), SCAFFOLD with the reference code's zeroed head gradient; evaluated every "
        f"{scale['eval_every']} rounds. Engine: `{engine_label(ENGINE)}` (`ENGINE` in results/paper_scale.py). "
        "Unlike the paper's runs (docs/fidelity.md): the kit's own shard and Dirichlet partitions (the reference "
        "partition files need torchvision's CIFAR files) and CIFAR-10's own channel statistics for normalisation.",
        "",
        "Accuracy in percent, mean ± std over the seeds done (n stated). *Reported* is the number the paper's code "
        "reports: the best evaluated round of the clients' local-test mean on shards, of the test set at α = 0.1. "
        "*Final* is the test accuracy after the last round. The paper's column is Table 3 (three seeds); DR and "
        "its control are not in it.",
        "",
        "| setting | cell | kit, reported | kit, final | paper (Table 3) |",
        "|---|---|---|---|---|",
    ]
    for g in groups(scale):
        for label in g.cells:
            runs = df[(df["setting"] == g.setting) & (df["cell"] == label)]
            key = PAPER_KEYS.get(label)
            ref = "—" if key is None else (f"{paper.loc[(key, 'mean'), g.setting]:.2f} ± "
                                            f"{paper.loc[(key, 'std'), g.setting]:.2f}")
            lines.append(f"| {g.setting} | {label} | {_mean_std(runs['reported'])} | {_mean_std(runs['final_acc'])} "
                         f"| {ref} |")
    lines += ["",
              "## Does FedDr+ beat FedAvg at s = 2 at the paper's scale?",
              "",
              "The paper: 76.57 ± 0.51 against 72.08 ± 0.67. " + _question(df, "FedDr+", "FedAvg"),
              "",
              "## Does feature distillation beat the β-scaled control?",
              "",
              "FedDr+ is β·DR + (1 − β)·FD; where FD's gradient is small it is DR at lr·β, so FD counts only if "
              "FedDr+ also beats DR at lr·β (`fk.federated.beta_scaled_dr`). "
              + _question(df, "FedDr+", "DR at lr·β (control)"),
              ""]
    return "\n".join(lines)


def write_doc(root: Path, scale: dict, path: Path) -> Path:
    write_text(path, render_doc(rows(root, scale), scale))
    return path


# --------------------------------------------------------------------------- command line
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--budget", type=float, default=math.inf, help="seconds: start only the runs that finish inside it")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side (processes on one GPU; needs fk.sweep.run(jobs=))")
    p.add_argument("--sec-per-round", type=float, default=None, help="plan with this many seconds per round")
    p.add_argument("--timing", nargs="*", default=[], help="timing CSVs (device, model, algorithm, engine, sec_per_round)")
    p.add_argument("--root", default=None, help=f"run folders (default {ROOT}; with --tiny {TINY_ROOT})")
    p.add_argument("--export", default=None, help="copy each finished run here, without its checkpoint")
    p.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: synthetic data, a cnn, two rounds of 3 of 10 clients")
    p.add_argument("--status", action="store_true", help="print the runs finished of those planned, and stop")
    p.add_argument("--collect-only", action="store_true", help="rewrite the CSV and the page from the runs on disk")
    p.add_argument("--doc", default=None, help=f"the page --collect-only writes (default {DOC}; with --tiny none)")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    return args


def check_args(args: argparse.Namespace) -> None:
    """One-line :class:`FeddrKitError` for numbers argparse lets through: a NaN budget (every comparison with it
    is false, so it would plan everything) and seconds per round that are not a positive finite number."""
    if math.isnan(args.budget):
        raise FeddrKitError(f"{WHO}: --budget must be a number of seconds (inf for no limit), got nan")
    if args.sec_per_round is not None and not (math.isfinite(args.sec_per_round) and args.sec_per_round > 0):
        raise FeddrKitError(f"{WHO}: --sec-per-round must be a finite number of seconds > 0, got {args.sec_per_round}")


def doc_path(args: argparse.Namespace, root: Path) -> Path | None:
    """The page ``--collect-only`` writes: ``--doc``; else, for the repository's own runs, ``docs/paper_scale.md``,
    and for runs in another ``--root`` that root's own :data:`PAGE` (the repository's page describes the
    repository's runs, so runs elsewhere never overwrite it); with ``--tiny``, none."""
    if args.doc:
        return Path(args.doc)
    if args.tiny:
        return None
    return DOC if root.resolve() == ROOT.resolve() else root / PAGE


def collect(args: argparse.Namespace, scale: dict, root: Path) -> None:
    """``--status`` and ``--collect-only``: the runs finished of those planned, and the CSV and page rewritten."""
    if args.collect_only and not root.is_dir():
        raise FeddrKitError(f"{WHO}: --root {root} is not a folder: there are no runs to collect")
    done, planned = len(rows(root, scale, args.seeds)), sum(len(g.cells) for g in groups(scale)) * len(args.seeds)
    print(f"paper_scale: {done} of {planned} planned runs finished in {root}")
    if args.collect_only:
        print(f"wrote {write_csv(root, scale)}")
        doc = doc_path(args, root)
        if doc is not None:
            print(f"wrote {write_doc(root, scale, doc)}")


def main(argv: list[str] | None = None) -> list[Unit]:
    """Run what fits (or report, or collect); returns the units started. Raises :class:`FeddrKitError` (one line)
    on bad input or an unreadable run file, and ``KeyboardInterrupt`` on Ctrl-C: :func:`cli` turns them into exit
    codes."""
    args = parse_args(argv)
    check_args(args)
    scale = TINY_SCALE if args.tiny else PAPER_SCALE
    root = Path(args.root) if args.root else (TINY_ROOT if args.tiny else ROOT)
    if args.status or args.collect_only:
        collect(args, scale, root)
        return []
    if args.budget <= 0:
        print("paper_scale: no time left in the budget; nothing started", flush=True)
        return []
    jobs = args.jobs if jobs_supported() else 1
    if jobs < args.jobs:
        print(f"fk.sweep.run has no jobs= here: planning {args.jobs} side by side as 1", flush=True)
    started = time.monotonic()

    def time_left() -> float:
        return args.budget - (time.monotonic() - started)

    data = fk.data.load(scale["dataset"])
    try:
        seconds_of = estimator(args, scale, data, time_left)
    except OutOfBudget:
        print(f"{WHO}: the budget ran out while timing a round (no run fits in it); nothing started", flush=True)
        return []
    units = pending_units(root, scale, args.seeds, seconds_of)
    budget = time_left()  # loading the data and any timed round came out of it
    chosen = plan(units, budget, jobs)
    print(f"{sum(len(u.seconds) for u in units)} runs pending; starting {sum(len(u.seconds) for u in chosen)} "
          f"(about {plan_seconds(chosen, jobs):.0f} s of {budget:.0f} s, {jobs} side by side)", flush=True)
    if not chosen:
        return []
    root.mkdir(parents=True, exist_ok=True)
    exporter = Exporter(root, scale, Path(args.export) if args.export else None).start()
    try:
        run_plan(chosen, scale, root, jobs, data)
    finally:
        exporter.stop()
    return chosen


def cli(argv: list[str] | None = None) -> int:
    """The command line: :func:`main` with ``python -m feddr_kit``'s exit codes and one line instead of a
    traceback: 0 done, 1 a run's process was lost, 2 bad input or an unreadable run file, 3 a result file could not
    be written, 130 Ctrl-C (:func:`feddr_kit.errors.report`)."""
    try:
        main(argv)
    except KeyboardInterrupt:  # fk.sweep.run has released every run's folder on the way out
        print("interrupted: the finished runs are kept and every run's folder released; the same command continues "
              "with the runs not finished", file=sys.stderr)
        return 130
    except FeddrKitError as err:
        return report(err)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
