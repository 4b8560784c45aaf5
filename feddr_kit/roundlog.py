"""The record of a run: each round's time, the history rows of the evaluated rounds, the callback, the
checkpoints and, at the end, the summary and the :class:`Result`. :func:`feddr_kit.run` and the
Flower strategy keep their record with the same :class:`RoundLog`, so their files are the same.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
from . import instruments, progress, rundir, tblog
from .build import Run
from .clients import fingerprint, fingerprint_changes
from .config import Config
from .data import ImageData
from .errors import FeddrKitError
from .evaluation import Evaluator
from .methods import Algorithm
from .models import Net
from .partition import Partition
from .rundir import save_checkpoint, write_json, write_text
from .schedule import RoundPlan


@dataclass
class Result:
    """What :func:`feddr_kit.run` returns (and the Flower apps' :func:`feddr_kit.flower.run_on_grid`).

    ``history``: one row per evaluated round (``round``, ``lr``, ``test_acc``, ``local_test_acc``,
    ``feature_norm``, ``train_loss``, ``seconds``, and the instruments', probes' and personalized
    methods' columns where they apply); ``summary``: final / best / last-5 accuracy, seconds per round, …;
    ``model``: the global model in its reported state; ``partition``, ``algorithm``, ``config`` as used;
    ``out_dir`` or None.
    """

    config: Config
    history: pd.DataFrame
    summary: dict[str, Any]
    model: Net
    algorithm: Algorithm
    partition: Partition
    data: ImageData
    out_dir: Path | None


def evaluate_global(setup: Run, evaluator: Evaluator, global_state: dict[str, torch.Tensor], plan: RoundPlan,
                    losses: list[float]) -> dict[str, Any]:
    """A history row (without ``seconds``) for the global state after ``plan``'s round: round, lr,
    test and local test accuracy of ``algo.eval_state(global_state)``, the clients' mean train loss.
    Personalized methods add their columns (``algo.personalized_metrics``, e.g. ``personalized_acc``).
    Leaves that evaluated state in ``setup.model``."""
    setup.model.load_state_dict(setup.algo.eval_state(global_state))
    row = {"round": plan.round + 1, "lr": plan.lr, **evaluator(setup.model, setup.algo),
           "train_loss": float(np.mean(losses))}
    row.update(setup.algo.personalized_metrics(setup.model, global_state, evaluator, plan.round, plan.lr))
    return row


def checkpoint_due(cfg: Config, round: int) -> bool:
    """Whether a checkpoint is written after round ``round`` (0-based): every ``checkpoint_every`` and at the end."""
    return bool(cfg.checkpoint_every and (round + 1) % cfg.checkpoint_every == 0) or round == cfg.rounds - 1


def summarize(history: pd.DataFrame, round_seconds: list[float], cfg: Config, lr0: float) -> dict[str, Any]:
    """Summary of a run: final / best / mean-of-last-5 accuracy, median seconds per round, the setting.

    ``lr0`` is the initial lr of the schedule in force (after a resume with a new lr, the new one).
    """
    acc = history["test_acc"]
    return {
        "final_acc": float(acc.iloc[-1]),
        "best_acc": float(acc.max()),
        "last5_acc": float(acc.tail(5).mean()),
        "final_local_acc": float(history["local_test_acc"].iloc[-1]),
        **({"final_personalized_acc": float(history["personalized_acc"].iloc[-1])}
           if "personalized_acc" in history else {}),
        "sec_per_round": float(statistics.median(round_seconds)),
        "total_seconds": float(sum(round_seconds)),
        "rounds": int(history["round"].iloc[-1]),
        "algorithm": cfg.algorithm,
        "regularizer": cfg.regularizer,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "lr0": lr0,
        "seed": cfg.seed,
    }


def _check_same_data(checkpoint: dict, now: dict, out_dir: Path | None) -> None:
    """Refuse to resume ``checkpoint`` on other data or another partition than it was trained on, naming what
    changed. A checkpoint without a fingerprint (written before the kit recorded one) is not checked."""
    saved = checkpoint.get(rundir.DATA_KEY)
    if not isinstance(saved, dict):
        return
    changed = fingerprint_changes(saved, now)
    if changed:
        where = f" in {out_dir / rundir.CHECKPOINT}" if out_dir is not None else ""
        raise FeddrKitError(f"resume: the data or partition changed since the checkpoint{where} was written "
                            f"({'; '.join(changed)}); resume on the data it was trained on, or start afresh "
                            "with overwrite")


class RoundLog:
    """The record of a run, the same for :func:`feddr_kit.run` and for Flower's strategy: each round's time, the
    history rows of the evaluated rounds, the callback, the checkpoints and, at the end, the :class:`Result`.

    With ``out_dir`` it writes ``config.json`` at once (and, with ``cfg.tensorboard``, each history row to
    ``out_dir/tb/``: :mod:`feddr_kit.tblog`), ``history.csv`` and ``checkpoint.pt`` when a
    checkpoint is due and ``summary.json`` (and ``history.csv`` again) at the end. A resumed run writes
    its ``config.json`` with its first checkpoint instead, removing the ``summary.json`` of the run it
    extends first, so that a resume that diverges or is killed before then leaves the folder as it found
    it, and one killed after never pairs a new config with an old summary. A ``checkpoint`` (read by
    :func:`feddr_kit.rundir.read_checkpoint`) is restored first: then ``start`` and ``start_state`` are the
    round and global state to continue from, else 0 and ``setup.initial_state``. ``callback(row)`` is
    called with every history row (a dict).
    """

    def __init__(self, setup: Run, out_dir: Path | None = None, callback: Callable[[dict], None] | None = None,
                 checkpoint: dict | None = None):
        self.setup, self.cfg, self.out_dir, self.callback = setup, setup.cfg, out_dir, callback
        self.start, self.start_state, self.rows, self.round_seconds = 0, setup.initial_state, [], []
        needed = out_dir is not None or checkpoint is not None
        self.fingerprint = fingerprint(setup.data, setup.partition) if needed else None
        if checkpoint is not None:
            _check_same_data(checkpoint, self.fingerprint, out_dir)
            self.start, self.start_state, self.rows, self.round_seconds = rundir.restore(checkpoint, setup.algo,
                                                                                         setup.device)
        self._config_pending = out_dir is not None
        if out_dir is not None and checkpoint is None:
            self._write_config()
        self.evaluator = Evaluator(setup.data, setup.partition, self.cfg.seed)
        self.writer = tblog.open_writer(out_dir, self.cfg.to_dict(), checkpoint is None) if self.cfg.tensorboard and out_dir else None
        self.bar = progress.bar(self.cfg.rounds, self.cfg.algorithm, unit="rounds", initial=self.start,
                                disable=not self.cfg.progress)
        self._t0 = 0.0

    def start_round(self) -> None:
        """Start the clock of a round."""
        self._t0 = time.perf_counter()

    def end_round(self, plan: RoundPlan, global_state: dict[str, torch.Tensor], losses: list[float],
                  gradients: list[instruments.GradientRatios | None], probe_rows: list[dict] = ()) -> dict | None:
        """Close ``plan``'s round on its new ``global_state``: on an evaluated round the history row
        (:func:`evaluate_global`, the instruments' ratios, ``seconds``, the mean of ``probe_rows``) is
        added, shown and given to the callback; the round's seconds are kept; a due checkpoint is
        written. Returns the row, or None on a round that is not evaluated."""
        row = None
        if plan.evaluating:
            row = evaluate_global(self.setup, self.evaluator, global_state, plan, losses)
            row.update(instruments.round_ratios(gradients))
        seconds = time.perf_counter() - self._t0
        if row is not None:
            row["seconds"] = seconds
            if probe_rows:
                row.update(pd.DataFrame(probe_rows).mean(skipna=True).to_dict())
            self.rows.append(row)
            if self.writer is not None:
                tblog.log_row(self.writer, row)
            self.bar.set_postfix(test_acc=f"{row['test_acc']:.2%}", train_loss=f"{row['train_loss']:.3f}")
            if self.callback is not None:
                self.callback(dict(row))
        self.round_seconds.append(seconds)
        self.bar.update(1)
        if self.out_dir is not None and checkpoint_due(self.cfg, plan.round):
            if self._config_pending:  # a resume: the folder changes from here on
                (self.out_dir / "summary.json").unlink(missing_ok=True)
            save_checkpoint(self.out_dir, plan.round + 1, global_state, self.setup.algo, self.rows,
                            self.round_seconds, self.cfg, self.fingerprint)
            if self._config_pending:
                self._write_config()
        return row

    def _write_config(self) -> None:
        write_text(self.out_dir / "config.json", self.cfg.to_json() + "\n")
        self._config_pending = False

    def finish(self, global_state: dict[str, torch.Tensor]) -> Result:
        """The :class:`Result` of the finished run (``setup.model`` in the reported state); writes
        ``summary.json`` to ``out_dir`` when given."""
        self.bar.close()
        if self.writer is not None:
            self.writer.close()
        setup = self.setup
        setup.model.load_state_dict(setup.algo.eval_state(global_state))
        history = pd.DataFrame(self.rows)
        summary = summarize(history, self.round_seconds, self.cfg, setup.lr0)
        if self.out_dir is not None:
            # The whole history again: a resume of a finished run mends a history.csv damaged since.
            write_text(self.out_dir / "history.csv", history.to_csv(index=False))
            if self._config_pending:
                self._write_config()
            write_json(self.out_dir / "summary.json", summary)
        return Result(self.cfg, history, summary, setup.model, setup.algo, setup.partition, setup.data, self.out_dir)
