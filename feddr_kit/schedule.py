"""The server's schedule: which clients train in each round, with which weights, at which lr, and
which rounds are evaluated. Every answer is a pure function of the config (and the partition's
client sizes), so every algorithm of one seed trains the same clients in the same rounds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .partition import Partition
from .streams import sample_clients

if TYPE_CHECKING:  # annotations only: the config module sits above this one
    from .config import Config


def lr_at(cfg: Config, lr0: float, round: int) -> float:
    """Learning rate of round ``round`` (0-based): ``lr0 · γ^(number of milestones ≤ round)``.

    Milestones are ``int(f · rounds)`` for ``f`` in ``cfg.lr_decay_at`` (paper: rounds 160 and 240 of 320).
    """
    passed = sum(round >= int(f * cfg.rounds) for f in cfg.lr_decay_at)
    return lr0 * cfg.lr_gamma**passed


def schedule_note(cfg: Config) -> str | None:
    """A one-line note when the lr schedule decays before the run's second evaluation, else None.

    Short runs with the default ``lr_decay_at`` (e.g. 2 rounds: round 2 runs at lr/100) are the case.
    """
    if not cfg.lr_decay_at or cfg.lr_gamma == 1.0:
        return None
    # The evaluated rounds (0-based) are every eval_every-th and the last; only the second one is needed
    # (the first, when there is one only), so it is computed, not found by walking every round.
    second_evaluation = min(2 * cfg.eval_every, cfg.rounds) - 1
    first_decay = min(int(f * cfg.rounds) for f in cfg.lr_decay_at)
    if first_decay >= cfg.rounds or first_decay > second_evaluation:
        return None
    last = lr_at(cfg, 1.0, cfg.rounds - 1)
    return (f"note: with rounds={cfg.rounds}, lr_decay_at={list(cfg.lr_decay_at)} and lr_gamma={cfg.lr_gamma:g}, the lr "
            f"drops from round {first_decay + 1} on, before a second evaluation (the last round runs at {last:g} x lr0); "
            "raise rounds, or pass --lr-gamma 1 for a constant lr")


@dataclass
class RoundPlan:
    """One round as the server plans it: ``clients`` (sampled ids, in the order the kit sums their
    states), their size ``weights`` (summing to 1), the ``lr`` and whether the round is ``evaluating``."""

    round: int
    lr: float
    clients: list[int]
    weights: list[float]
    evaluating: bool


def plan_round(cfg: Config, lr0: float, round: int, part: Partition) -> RoundPlan:
    """The :class:`RoundPlan` of round ``round`` (0-based): a pure function of the config and the partition."""
    clients = sample_clients(cfg.seed, round, cfg.num_clients, cfg.clients_per_round)
    sizes = np.array([len(part.train_indices[k]) for k in clients], dtype=np.float64)
    evaluating = (round + 1) % cfg.eval_every == 0 or round == cfg.rounds - 1
    return RoundPlan(round, lr_at(cfg, lr0, round), clients.tolist(), (sizes / sizes.sum()).tolist(), evaluating)
