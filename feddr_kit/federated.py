"""The round loop: ``run(config) -> Result``, built from pieces that the Flower apps use too.

One round: sample clients from a seeded stream (the same clients for every algorithm under one
seed), train each from the global state on one reusable local model, accumulate the size-weighted
average on the fly, let the algorithm turn it into the next global state, evaluate, probe,
checkpoint. All local randomness is derived from ``(seed, round, client)`` (:mod:`feddr_kit.streams`),
so a resumed run replays exactly what an uninterrupted one would have done.

The pieces, which :mod:`feddr_kit.flower` calls too, so that a Flower run is this run:
:func:`open_run` (the folder, the checkpoint, and :func:`feddr_kit.build.build_run`, the one seeded
build: model, algorithm, lr and regularizer), :func:`feddr_kit.schedule.plan_round` (sampling,
weights, lr), :func:`train_clients`, :class:`Aggregate` (the size-weighted sum in the plan's order
and the next global state) and :class:`feddr_kit.roundlog.RoundLog` (evaluation, timing, history,
callback, checkpoints, the result).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from . import engine as engine_mod
from . import instruments, rundir, tblog
from . import probes as probes_mod
from .build import Run, RunSetup, build_algorithm, build_run, prepare
from .clients import check_partition, load_data, make_partition
from .config import Config
from .data import ImageData
from .engine import resolve_device
from .errors import DivergedError, FeddrKitError
from .evaluation import Evaluator, forward_all, probe_set, probe_view
from .local import (body_parameter_names, build_teacher, check_local_loss, client_batch, client_loss,
                    dirichlet_steps, local_batches, local_step, local_steps, measured_terms, train_client)
from .methods import ALGORITHMS, Algorithm, ClientContext, get_algorithm, initial_lr, resolve_regularizer
from .partition import Partition
from .roundlog import Result, RoundLog, checkpoint_due, evaluate_global, summarize
from .rundir import CHECKPOINT, save_checkpoint, write_json, write_text
from .schedule import RoundPlan, lr_at, plan_round, schedule_note
from .streams import client_generator, sample_clients

# Names the notebooks, tests, benchmarks and results scripts use as fk.federated.<name>: each lives in
# the module that holds its one job, and is re-exported here.
__all__ = ["Result", "Run", "RunSetup", "RoundPlan", "Aggregate", "RoundLog", "run", "open_run", "build_run", "prepare",
           "build_algorithm", "plan_round", "lr_at", "schedule_note", "beta_scaled_dr", "train_clients", "load_teacher",
           "new_average", "accumulate", "next_global_state", "finish_round", "evaluate_global", "summarize",
           "checkpoint_due", "initial_lr", "resolve_device", "sample_clients", "client_generator", "Evaluator",
           "forward_all", "probe_set", "probe_view", "local_steps", "local_batches", "dirichlet_steps", "local_step",
           "train_client", "client_batch", "client_loss", "measured_terms", "body_parameter_names", "check_local_loss",
           "build_teacher", "load_data", "make_partition", "check_partition", "CHECKPOINT", "save_checkpoint",
           "write_json", "write_text", "ALGORITHMS", "get_algorithm"]


# --------------------------------------------------------------------------- a control arm
def beta_scaled_dr(cfg: Config, out_dir: str | None = None) -> Config:
    """The control arm of a FedDr+ comparison: plain DR (no regularizer) at ``lr0 · β``, all else as ``cfg``.

    FedDr+'s loss is ``β·L_DR + (1-β)·L_FD``. When the FD term's gradient is negligible (features of
    small norm; see :mod:`feddr_kit.instruments`), FedDr+ is DR with its step scaled by β, and a
    FedDr+ gain over DR may be nothing but a smaller step. A claim about feature distillation holds
    only if FedDr+ also beats this control. ``cfg`` is a FedDr+ config (``algorithm="feddr+"``, or
    ``"dr"`` with ``regularizer="fd"``); ``lr0`` is :func:`initial_lr`'s. Returns a new config, with
    ``out_dir`` (default None: nothing saved) so that it never writes into the FedDr+ run's folder.
    """
    if resolve_regularizer(cfg).regularizer != "fd" or cfg.algorithm not in ("feddr+", "dr"):
        raise FeddrKitError(f"beta_scaled_dr: the control is defined for FedDr+ (algorithm='feddr+', or 'dr' with "
                            f"regularizer='fd'), got algorithm={cfg.algorithm!r}, regularizer={cfg.regularizer!r}")
    if cfg.beta == 0:
        raise FeddrKitError("beta_scaled_dr: beta=0 leaves no DR term, so its control would train at lr 0; "
                            "compare beta=0 with DR directly")
    return cfg.replace(algorithm="dr", regularizer="none", lr=initial_lr(cfg) * cfg.beta, out_dir=out_dir)


# --------------------------------------------------------------------------- one round
def train_clients(setup: Run, ctxs: list[ClientContext], engine: str | None = None
                  ) -> Iterator[tuple[ClientContext, float, dict]]:
    """Train clients from the received global state (``ctxs[i].global_state``, the same for all).

    Yields ``(ctx, mean local loss, upload)`` per client in order, with ``setup.model`` then holding
    that client's final local state (read it before the next ``next``); ``upload`` is
    ``algo.client_end``'s dict (typed by ``Algorithm.uploads``). ``setup.teacher`` must already hold
    the global state when ``algo.needs_teacher`` (:func:`load_teacher`). ``engine``: default the run's.
    """
    trained = engine_mod.train_round(engine or setup.engine, setup.model, setup.teacher, setup.algo, setup.data,
                                     [setup.clients.indices[c.client] for c in ctxs], ctxs, setup.cfg, setup.device)
    for ctx, loss in zip(ctxs, trained):
        yield ctx, loss, setup.algo.client_end(setup.model, ctx)


def load_teacher(setup: Run, global_state: dict[str, torch.Tensor]) -> None:
    """Load the round's global state into ``setup.teacher`` (the distillation teacher, the probes' global view)."""
    setup.teacher.load_state_dict(global_state)


# --------------------------------------------------------------------------- aggregation
def new_average(global_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Zeros like the floating-point entries of ``global_state``: the accumulator of a round's average."""
    return {k: torch.zeros_like(v) for k, v in global_state.items() if v.is_floating_point()}


def accumulate(average: dict[str, torch.Tensor], client_state: list[torch.Tensor], weight: float) -> None:
    """``average += weight · client_state`` in place; ``client_state`` lists tensors in ``average``'s order.

    Clients must be added in the :class:`RoundPlan`'s order for the float sums to be the kit's.
    """
    torch._foreach_add_(list(average.values()), client_state, alpha=weight)


def next_global_state(algo: Algorithm, global_state: dict[str, torch.Tensor], average: dict[str, torch.Tensor],
                      uploads: list[dict], weights: list[float], round: int) -> dict[str, torch.Tensor]:
    """The next global state from a round's weighted ``average`` (float entries) and ``uploads`` (plan order).

    Integer buffers are not averaged: they keep the global values. Then ``algo.server_update`` and
    ``algo.finalize_global`` (the frozen head re-asserted).
    """
    for n, v in global_state.items():
        average.setdefault(n, v.clone())
    return algo.finalize_global(algo.server_update(global_state, average, uploads, weights, round))


def finish_round(setup: Run, global_state: dict[str, torch.Tensor], round: int) -> None:
    """What follows a round's aggregation before its evaluation: after the last round, the algorithm's
    ``after_training`` (SphereFed's head calibration) on the scratch ``setup.model``."""
    if round == setup.cfg.rounds - 1:
        setup.algo.after_training(setup.model, global_state, setup.data, setup.partition)


class Aggregate:
    """What the server gathers of one round's clients, added in the :class:`RoundPlan`'s order: the
    size-weighted sum of their states (``average``), their ``uploads``, mean local ``losses`` and
    instrument sums (``gradients``, None where nothing was measured)."""

    def __init__(self, global_state: dict[str, torch.Tensor]):
        self.global_state = global_state
        self.average = new_average(global_state)
        self.uploads: list[dict] = []
        self.losses: list[float] = []
        self.gradients: list[instruments.GradientRatios | None] = []

    def add(self, state: list[torch.Tensor], weight: float, loss: float, upload: dict,
            gradients: instruments.GradientRatios | None) -> None:
        """Add one client: ``state`` lists its float tensors in ``average``'s order."""
        accumulate(self.average, state, weight)
        self.uploads.append(upload)
        self.losses.append(loss)
        self.gradients.append(gradients)

    def next_global_state(self, setup: Run, plan: RoundPlan) -> dict[str, torch.Tensor]:
        """The global state after the round (:func:`next_global_state`, then :func:`finish_round`)."""
        state = next_global_state(setup.algo, self.global_state, self.average, self.uploads, plan.weights, plan.round)
        finish_round(setup, state, plan.round)
        return state


# --------------------------------------------------------------------------- the run
@contextlib.contextmanager
def open_run(cfg: Config, *, resume: bool = False, data: ImageData | None = None, partition: Partition | None = None,
             callback: Callable[[dict], None] | None = None, claim: bool = True) -> Iterator[RoundLog]:
    """Everything a run does before its first round, held while it runs; yields its :class:`RoundLog`.

    Under the config's kernel settings (:func:`feddr_kit.engine.kernel_settings`): the regularizer is
    decided (:func:`feddr_kit.methods.resolve_regularizer`), ``out_dir`` (when set) is owned
    (:func:`feddr_kit.rundir.claim`; ``claim=False`` when the caller owns it, as ``flower.simulate``
    does for its ServerApp) and, with ``resume``, its checkpoint is read (a ``channels_last=None`` takes the
    checkpoint's layout: :func:`feddr_kit.rundir.continued`); then :func:`build_run`.
    A :class:`DivergedError` from the rounds gets the way on appended (:func:`diverged_advice`).
    """
    cfg = resolve_regularizer(cfg)
    if resume and not cfg.out_dir:
        raise FeddrKitError("resume=True needs out_dir: the folder holding checkpoint.pt")
    if cfg.tensorboard:  # refused before any data loads
        if not cfg.out_dir:
            raise FeddrKitError("tensorboard=True needs out_dir: the event files go to out_dir/tb/")
        tblog.check_available()
    device = resolve_device(cfg.device)
    with engine_mod.kernel_settings(cfg.deterministic, device, cfg.tf32), _folder(cfg, resume, claim) as out_dir:
        checkpoint = None
        if resume:
            checkpoint = rundir.read_checkpoint(out_dir, cfg, ALGORITHMS[cfg.algorithm].regularizer_for(None),
                                                _default_lr(cfg))
            # channels_last=None continues the checkpoint's layout, not this machine's choice: build_run lays
            # the model out before the checkpoint's state is loaded into it.
            cfg = cfg.replace(**rundir.continued(checkpoint, cfg.to_dict()))
        try:
            yield RoundLog(build_run(cfg, device, data, partition), out_dir, callback, checkpoint)
        except DivergedError as err:
            raise DivergedError(f"{err} {diverged_advice(out_dir)}") from None


def _default_lr(cfg: Config) -> float | None:
    """The initial lr ``cfg`` would use with ``lr=None``, or None when its model has no default lr."""
    with contextlib.suppress(FeddrKitError):
        return initial_lr(cfg.replace(lr=None))
    return None


def diverged_advice(out_dir: Path | None) -> str:
    """What to do after a divergence, by what ``out_dir`` holds: resume its last checkpoint with a smaller lr,
    or, before the first checkpoint, start again with one (a folder holding only config.json needs no overwrite)."""
    if out_dir is None:
        return "(run again with a smaller lr)"
    if (out_dir / CHECKPOINT).exists():
        done = _checkpoint_round(out_dir / CHECKPOINT)
        return (f"(the last checkpoint in {out_dir}{done} is kept: resume from it with a smaller lr, "
                "resume=True / --resume with lr / --lr)")
    return (f"(no checkpoint was written in {out_dir} yet: run again with a smaller lr, without resume; "
            "the folder is started afresh)")


def _checkpoint_round(path: Path) -> str:
    with contextlib.suppress(Exception):  # the advice must not fail on a checkpoint it cannot read
        return f", after round {int(torch.load(path, map_location='cpu', weights_only=False)['next_round'])}"
    return ""


@contextlib.contextmanager
def _folder(cfg: Config, resume: bool, claim: bool) -> Iterator[Path | None]:
    if not cfg.out_dir:
        yield None
    elif not claim:
        yield Path(cfg.out_dir)
    else:
        with rundir.claim(Path(cfg.out_dir), resume=resume, overwrite=cfg.overwrite) as out_dir:
            yield out_dir


def run(
    cfg: Config | None = None,
    *,
    resume: bool = False,
    data: ImageData | None = None,
    partition: Partition | None = None,
    callback: Callable[[dict], None] | None = None,
    claim: bool = True,
    **overrides: Any,
) -> Result:
    """Run federated training as ``cfg`` says and return a :class:`Result`.

    ``overrides`` replace config fields (``run(cfg, rounds=5)``). ``data`` / ``partition`` reuse
    already-loaded ones (they must match the config). ``resume=True`` continues from
    ``out_dir/checkpoint.pt`` (``rounds`` and ``lr`` may change). ``callback(row)`` is called after
    every evaluated round with the history row (a dict) — for live plots, or to stop a run by raising.

    With ``out_dir``, the run owns that folder while it runs (:func:`feddr_kit.rundir.claim`): another
    run into it is refused, and so is a fresh run into a folder holding results unless ``cfg.overwrite``.
    ``claim=False`` when the caller already holds ``out_dir`` (:func:`feddr_kit.rundir.claim`, as a sweep does
    while it prepares and runs each folder). ``regularizer=None`` is replaced by the algorithm's own in the
    returned and saved config.
    """
    cfg = (cfg or Config()).replace(**overrides) if overrides else (cfg or Config())
    with open_run(cfg, resume=resume, data=data, partition=partition, callback=callback, claim=claim) as log:
        return _rounds(log)


def _rounds(log: RoundLog) -> Result:
    """The rounds of :func:`run` from ``log.start`` on, each trained on this process's engine."""
    setup, cfg = log.setup, log.cfg
    algo, model, data = setup.algo, setup.model, setup.data
    global_state = log.start_state
    local_state = model.state_dict()  # views of the live parameters
    probe = probe_set(data, cfg.probe_samples, cfg.seed, model) if cfg.probes else None
    body = [n for n, _ in model.named_parameters() if n.startswith("body.")]  # the extractor, whose drift is probed
    for t in range(log.start, cfg.rounds):
        log.start_round()
        plan = plan_round(cfg, setup.lr0, t, setup.partition)
        probing = probe is not None and plan.evaluating  # probes are recorded with the evaluated rounds only
        if algo.needs_teacher or probing:
            load_teacher(setup, global_state)
        global_view = probe_view(setup.teacher, algo, data, *probe) if probing else None

        gathered = Aggregate(global_state)
        averaged_local = [local_state[n] for n in gathered.average]  # live views: each client's weights in turn
        ctxs = [setup.context(k, t, plan.lr, global_state, measure=plan.evaluating) for k in plan.clients]
        probe_rows = []
        for (ctx, loss, upload), w in zip(train_clients(setup, ctxs), plan.weights):  # model holds ctx.client's state
            gathered.add(averaged_local, w, loss, upload, ctx.gradients)
            if probing:
                observed = setup.clients.counts[ctx.client] > 0
                row = probes_mod.compare(probe_view(model, algo, data, *probe), global_view, probe[1], observed)
                row["weight_change"] = probes_mod.relative_change([local_state[n] for n in body],
                                                                  [global_state[n] for n in body])
                probe_rows.append(row)
        global_state = gathered.next_global_state(setup, plan)
        log.end_round(plan, global_state, gathered.losses, gathered.gradients, probe_rows)
    return log.finish(global_state)
