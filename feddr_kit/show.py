"""``python -m feddr_kit show PATH``: a run's or a sweep's results without writing Python.

For a run folder: its summary (accuracies in percent) and its history drawn to ``history.png`` in the
folder. For a sweep root: the mean and 95 % t interval over seeds of every grid point
(:func:`feddr_kit.sweep.interval_summary`), saved with ``--csv FILE``. What the files and columns
mean: docs/outputs.md. Every file is read through the run folder's checked readers and written
atomically (:mod:`feddr_kit.rundir`): a broken file is one line naming it, a failed write leaves no torn file.
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pandas as pd

from . import sweep
from .errors import FeddrKitError, report
from .rundir import atomic_write, read_csv, read_json, writable_folder, write_text

PLOT = "history.png"
RUN_FILES = ("config.json", "history.csv", "summary.json")


def is_run(path: Path) -> bool:
    """Whether ``path`` is one run's folder (it holds config.json, history.csv or summary.json)."""
    return any((path / name).is_file() for name in RUN_FILES)


def is_sweep(path: Path) -> bool:
    """Whether ``path`` is a sweep root (sweep.json, or subfolders that are runs)."""
    return (path / sweep.SWEEP).is_file() or any(p.is_dir() and is_run(p) for p in path.iterdir())


def _value_text(key: str, value: Any) -> str:
    if isinstance(value, float) and key.endswith("acc"):
        return f"{value:.2%}"
    if isinstance(value, float) and ("seconds" in key or key == "sec_per_round"):
        return f"{value:.2f} s"
    return str(value)


def _history(folder: Path) -> pd.DataFrame:
    """The run's ``history.csv``, with its ``round`` column; one line when it is broken."""
    history = read_csv(folder / "history.csv", "show")
    if "round" not in history:
        raise FeddrKitError(f"show: {folder / 'history.csv'} has no round column; it is not a run's history")
    return history


def run_text(folder: Path) -> str:
    """The summary of the run in ``folder`` as aligned ``name  value`` lines (accuracies in percent);
    for a run not finished, its last recorded round."""
    if (folder / "summary.json").is_file():
        summary = read_json(folder / "summary.json", "show")
        if not isinstance(summary, dict) or not summary:
            raise FeddrKitError(f"show: {folder / 'summary.json'} holds no summary (not a JSON object with fields)")
        width = max(map(len, summary))
        lines = [f"{k:<{width}}  {_value_text(k, v)}" for k, v in summary.items()]
        return f"{folder}: finished run\n" + "\n".join(lines)
    history = _history(folder) if (folder / "history.csv").is_file() else pd.DataFrame()
    if history.empty:
        return f"{folder}: a run that has recorded no evaluated round yet"
    last = history.iloc[-1]
    accuracy = f"; test accuracy {last['test_acc']:.2%} at round {int(last['round'])}" if "test_acc" in history else ""
    return f"{folder}: unfinished run, {int(last['round'])} rounds recorded{accuracy}"


def plot_history(folder: Path) -> Path | None:
    """Draw the run's ``history.csv`` (test and local test accuracy, and train loss, over rounds) to
    ``folder/history.png`` (atomically); returns its path, or None when there is no evaluated round yet."""
    if not (folder / "history.csv").is_file():
        return None
    history = _history(folder)
    if history.empty:
        return None
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    acc, loss = fig.subplots(1, 2)
    for column, label in (("test_acc", "global model, global test set"),
                          ("local_test_acc", "global model, mean over clients' test sets"),
                          ("personalized_acc", "personalized models, mean over clients")):
        if column in history:
            acc.plot(history["round"], 100 * history[column], marker="o", label=label)
    acc.set(xlabel="communication round", ylabel="accuracy (%)", title="test accuracy")
    acc.legend()
    if "train_loss" in history:
        loss.plot(history["round"], history["train_loss"], marker="o", color="tab:red",
                  label="mean over the round's clients")
        loss.legend()
    loss.set(xlabel="communication round", ylabel="train loss", title="local training loss")
    fig.suptitle(str(folder))
    atomic_write(folder / PLOT, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    return folder / PLOT


def sweep_text(table: pd.DataFrame) -> str:
    """:func:`feddr_kit.sweep.interval_summary`'s table as text: accuracies in percent, ``mean ± half width [low, high]``."""
    value = table["value"].iloc[0]
    scale = 100.0 if value.endswith("acc") else 1.0
    by = list(table.columns[:list(table.columns).index("value")])

    def cell(r) -> str:
        text = f"{r['mean'] * scale:.2f}"
        if math.isfinite(r["half_width"]):
            text += f" ± {r['half_width'] * scale:.2f} [{r['low'] * scale:.2f}, {r['high'] * scale:.2f}]"
        return text

    shown = table[by].copy()
    shown[f"{value}{' (%)' if scale == 100 else ''}: mean ± 95 % t interval over seeds"] = table.apply(cell, axis=1)
    shown["seeds"] = table["n"].astype(int)
    with pd.option_context("display.width", 200, "display.max_columns", 50, "display.max_colwidth", 80):
        return shown.to_string(index=False)


def main(args: dict[str, Any]) -> int:
    """The ``show`` command: prints a run's summary (and writes its history plot) or a sweep's interval
    table (and with ``--csv`` saves it, its folder checked first). Returns 0, 2 on bad input (a broken
    file, a destination that cannot be written), 3 when a write fails."""
    path = Path(args["path"])
    try:
        if not path.is_dir():
            raise FeddrKitError(f"{path} is not a folder; give a run folder (--out-dir of run) or a sweep root")
        if is_run(path):
            if args.get("csv"):
                raise FeddrKitError("--csv saves a sweep's table; for a run, history.csv and summary.json are the tables")
            print(run_text(path))
            png = plot_history(path)
            if png is not None:
                print(f"history plot: {png}")
        elif is_sweep(path):
            csv = Path(args["csv"]) if args.get("csv") else None
            with writable_folder(csv.parent, "--csv") if csv else contextlib.nullcontext():
                table = sweep.interval_summary(path, args.get("value") or "final_acc")
                if csv:
                    write_text(csv, table.to_csv(index=False))
            print(sweep_text(table))
            if csv:
                print(f"table saved to {csv}")
        else:
            raise FeddrKitError(f"{path} holds neither a run (config.json, history.csv, summary.json) nor a sweep "
                                "(sweep.json or run folders)")
    except FeddrKitError as err:
        return report(err)
    return 0
