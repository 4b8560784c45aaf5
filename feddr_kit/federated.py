"""The round loop: ``run(config) -> Result``.

One round: sample clients from a seeded stream (the same clients for every algorithm under one
seed), train each from the global state on one reusable local model, accumulate the size-weighted
average on the fly, let the algorithm turn it into the next global state, evaluate, probe,
checkpoint. The dataset lives on the training device as uint8 tensors; batches are gathered,
augmented and normalized there. All local randomness is derived from ``(seed, round, client)``,
so a resumed run replays exactly what an uninterrupted one would have done.

The round is built from pieces that :mod:`feddr_kit.flower` calls too, so a Flower run is this run:
:func:`prepare` (set-up), :func:`plan_round` (sampling, weights, lr), :func:`client_context` and
:func:`train_clients` (train from a received global state), :func:`new_average`, :func:`accumulate`
and :func:`next_global_state` (aggregation), :func:`evaluate_global`, :func:`save_checkpoint` and
:func:`finish_run`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import engine as engine_mod
from . import instruments
from . import partition as partition_mod
from . import probes as probes_mod
from . import rundir
from .algorithms import ALGORITHMS, Algorithm, Batch, ClientContext, get_algorithm
from .config import Config
from .data import ImageData, load
from .errors import DivergedError, FeddrKitError
from .models import EVAL_BATCH_SIZE, Net, build_model, eval_order
from .partition import Partition

CHECKPOINT = "checkpoint.pt"
# Fields that may differ between a run and its resumption. rounds and lr change the results from the
# resumed round on (the schedule is recomputed; a smaller lr is the way on after a divergence).
RESUMABLE_CHANGES = {"rounds", "lr", "progress", "out_dir", "overwrite", "checkpoint_every", "device"}


@dataclass
class Result:
    """What :func:`run` returns.

    ``history``: one row per evaluated round (columns in DESIGN.md's results format);
    ``summary``: final / best / last-5 accuracy, seconds per round, …; ``model``: the global model
    in its reported state; ``partition``, ``algorithm``, ``config`` as used; ``out_dir`` or None.
    """

    config: Config
    history: pd.DataFrame
    summary: dict[str, Any]
    model: Net
    algorithm: Algorithm
    partition: Partition
    data: ImageData
    out_dir: Path | None


# --------------------------------------------------------------------------- small pure helpers
def resolve_device(name: str) -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; ``"cuda"`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FeddrKitError("device='cuda' was asked for but no CUDA GPU is available; use device='auto' or 'cpu'")
    return torch.device(name)


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
    evaluated = [t for t in range(cfg.rounds) if (t + 1) % cfg.eval_every == 0 or t == cfg.rounds - 1]
    first_decay = min(int(f * cfg.rounds) for f in cfg.lr_decay_at)
    if first_decay >= cfg.rounds or first_decay > evaluated[min(1, len(evaluated) - 1)]:
        return None
    last = lr_at(cfg, 1.0, cfg.rounds - 1)
    return (f"note: with rounds={cfg.rounds}, lr_decay_at={list(cfg.lr_decay_at)} and lr_gamma={cfg.lr_gamma:g}, the lr "
            f"drops from round {first_decay + 1} on, before a second evaluation (the last round runs at {last:g} x lr0); "
            "raise rounds, or pass --lr-gamma 1 for a constant lr")


def sample_clients(seed: int, round: int, num_clients: int, per_round: int) -> np.ndarray:
    """The clients of round ``round``: ``per_round`` distinct ids, a pure function of ``(seed, round)``."""
    return np.random.default_rng([seed, round, 1]).choice(num_clients, per_round, replace=False)


def client_generator(seed: int, round: int, client: int, device: torch.device) -> torch.Generator:
    """The RNG of one client's local training in one round (batch order and augmentation)."""
    s = int(np.random.SeedSequence([seed, round, client]).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator(device=device).manual_seed(s)


def dirichlet_steps(cfg: Config) -> bool:
    """True when clients take the Dirichlet (LDA) rule's random batches: ``partition="dirichlet"``, or a
    reference partition file of the Dirichlet kind (:func:`feddr_kit.partition.reference_scheme`)."""
    if cfg.partition == "reference":
        return partition_mod.reference_scheme(cfg.reference_partition) == "dirichlet"
    return cfg.partition == "dirichlet"


def local_steps(num_samples: int, cfg: Config, mean_client_size: int) -> int:
    """Local SGD steps of a client (spec §0).

    Shard / iid: ``E`` full epochs, ``E·⌈n/B⌉`` steps. Dirichlet: ``E·⌊(N/K)/B⌋`` random batches
    whatever the client's own size ``n``, with ``N/K`` = ``mean_client_size``.
    """
    if dirichlet_steps(cfg):
        return cfg.local_epochs * max(1, mean_client_size // cfg.batch_size)
    return cfg.local_epochs * math.ceil(num_samples / cfg.batch_size)


def local_batches(indices: torch.Tensor, cfg: Config, num_steps: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Yield ``num_steps`` index batches of one client.

    Shard / iid: shuffled full epochs (the last batch of an epoch may be smaller). Dirichlet: each
    batch is the first ``B`` of a fresh shuffle, so batches are i.i.d. across steps (spec §0).
    """
    n = indices.numel()
    if dirichlet_steps(cfg):
        for _ in range(num_steps):
            yield indices[torch.randperm(n, generator=gen, device=indices.device)[: cfg.batch_size]]
        return
    # Whole shuffled epochs until num_steps batches (E·⌈n/B⌉ steps are exactly E epochs; an algorithm
    # asking for more steps through Algorithm.num_local_steps gets more epochs, e.g. FedRep's head epochs).
    steps = 0
    while steps < num_steps:
        for batch in indices[torch.randperm(n, generator=gen, device=indices.device)].split(cfg.batch_size):
            yield batch
            steps += 1
            if steps == num_steps:
                return


def make_partition(cfg: Config, data: ImageData) -> Partition:
    """The partition the config asks for, over ``data``'s train and test labels."""
    seed = cfg.seed if cfg.partition_seed is None else cfg.partition_seed
    y, ty = data.train_y.cpu(), data.test_y.cpu()
    if cfg.partition == "shard":
        return partition_mod.shard(y, ty, cfg.num_clients, cfg.shards_per_client, seed=seed)
    if cfg.partition == "dirichlet":
        return partition_mod.dirichlet(y, ty, cfg.num_clients, cfg.alpha, seed=seed)
    if cfg.partition == "reference":
        return partition_mod.reference(cfg.reference_partition, y, ty, seed=seed)
    return partition_mod.iid(y, ty, cfg.num_clients, seed=seed)


def check_partition(part: Partition, data: ImageData, cfg: Config) -> None:
    """Raise :class:`FeddrKitError` unless ``part`` has ``cfg.num_clients`` clients and indexes into ``data``."""
    if part.num_clients != cfg.num_clients:
        raise FeddrKitError(f"partition has {part.num_clients} clients but num_clients={cfg.num_clients}")
    for split, indices, n in (("train", part.train_indices, len(data.train_y)), ("test", part.test_indices, len(data.test_y))):
        top = max((int(t.max()) for t in indices if len(t)), default=-1)
        if top >= n:
            raise FeddrKitError(f"partition: its {split} indices reach {top} but the data has {n} {split} images; "
                                "make the partition from this data's labels")


def load_data(cfg: Config) -> ImageData:
    """Load the config's dataset (``data_path`` for image folders)."""
    if cfg.dataset == "imagefolder":
        return load("imagefolder", path=cfg.data_path)
    return load(cfg.dataset)


# --------------------------------------------------------------------------- file output
def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Write a file through ``write(tmp_path)`` then rename it over ``path``: never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, rundir.FILE_MODE)  # the mode a plain open() gives, not mkstemp's 0600
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path: Path, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON (NaN written as null)."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if isinstance(v, (np.floating, np.integer)):
            return clean(v.item())
        return v

    write_text(path, json.dumps(clean(obj), indent=2) + "\n")


# --------------------------------------------------------------------------- evaluation
@torch.no_grad()
def forward_all(model: Net, algo: Algorithm, data: ImageData, x: torch.Tensor,
                order: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw features ``[N, d]`` and logits ``[N, C]`` of uint8 images ``x`` ``[N,3,H,W]``, in eval mode.

    Models whose BatchNorm uses batch statistics are fed fixed batches of ``EVAL_BATCH_SIZE`` (spec §0),
    made in the order ``order`` (int64 ``[N]``, a permutation of ``range(N)``; default: x's own order).
    The outputs are in ``x``'s order either way.
    """
    model.eval()
    bs = EVAL_BATCH_SIZE if model.batch_stat_norm else 1000
    idx = None if order is None else order.to(x.device)
    chunks = x.split(bs) if idx is None else (x[i] for i in idx.split(bs))
    hs, zs = [], []
    for chunk in chunks:
        h = model.features(data.normalize(chunk)).float()
        hs.append(h)
        zs.append(algo.logits(model, h).float())
    h, z = torch.cat(hs), torch.cat(zs)
    if idx is None:
        return h, z
    h_out, z_out = torch.empty_like(h), torch.empty_like(z)
    h_out[idx], z_out[idx] = h, z
    return h_out, z_out


class Evaluator:
    """Global test accuracy, the mean over clients of accuracy on each client's local test set, and the
    global model's ``feature_norm``: the mean norm ``‖f(x)‖`` of its raw features over the test set.

    A model without batch-statistics BatchNorm is evaluated in one pass over the test set in its
    stored order (the order cannot change its outputs). A batch-statistics model (mobilenet) sees the
    test set in one fixed permutation drawn from ``seed`` (:func:`feddr_kit.models.eval_order`), the
    same in every round and on resume, in batches of ``EVAL_BATCH_SIZE``; each client's local
    accuracy comes from its own test set, permuted the same way and batched alone, as a client would.
    """

    def __init__(self, data: ImageData, part: Partition, seed: int = 0):
        self.data = data
        self.seed = seed
        ids = [np.full(len(t), k) for k, t in enumerate(part.test_indices)]
        dev = data.test_y.device
        self.flat_idx = torch.from_numpy(np.concatenate(part.test_indices).astype(np.int64)).to(dev)
        self.client_of = torch.from_numpy(np.concatenate(ids).astype(np.int64)).to(dev)
        self.num_clients = part.num_clients
        self.test_indices = part.test_indices
        self.partition = part

    def global_order(self) -> torch.Tensor:
        """The order a batch-statistics model sees the test set in: int64 ``[M]``."""
        return eval_order(len(self.data.test_y), self.seed, 0)

    def client_order(self, client: int) -> torch.Tensor:
        """Test indices of ``client`` in the order a batch-statistics model sees them: int64 ``[m_k]``."""
        idx = torch.from_numpy(np.asarray(self.test_indices[client], dtype=np.int64))
        return idx[eval_order(len(idx), self.seed, 1, client)]

    def client_accuracy(self, model: Net, algo: Algorithm, client: int) -> float:
        """Accuracy of ``model`` on ``client``'s own test set alone (0 when it is empty), in
        :meth:`client_order` for a batch-statistics model."""
        if model.batch_stat_norm:
            idx = self.client_order(client)
        else:
            idx = torch.from_numpy(np.asarray(self.test_indices[client], dtype=np.int64))
        if len(idx) == 0:
            return 0.0
        idx = idx.to(self.data.test_x.device)
        _, z = forward_all(model, algo, self.data, self.data.test_x[idx])
        return float((z.argmax(1) == self.data.test_y[idx]).float().mean())

    def __call__(self, model: Net, algo: Algorithm) -> dict[str, float]:
        if model.batch_stat_norm:
            return self._batch_stat(model, algo)
        h, logits = forward_all(model, algo, self.data, self.data.test_x)
        correct = (logits.argmax(1) == self.data.test_y).float()
        # Each client's local test set is a subset of the test set, so one pass serves all of them.
        # scatter_add_ into a 1-D tensor, not a weighted bincount: it has a deterministic CUDA kernel.
        hits = correct.new_zeros(self.num_clients).scatter_add_(0, self.client_of, correct[self.flat_idx])
        sizes = torch.bincount(self.client_of, minlength=self.num_clients).clamp(min=1)
        return {"test_acc": float(correct.mean()), "local_test_acc": float((hits / sizes).mean()),
                "feature_norm": float(h.norm(dim=1).mean())}

    def _batch_stat(self, model: Net, algo: Algorithm) -> dict[str, float]:
        x, y = self.data.test_x, self.data.test_y
        h, logits = forward_all(model, algo, self.data, x, self.global_order())
        local = []
        for k in range(self.num_clients):
            idx = self.client_order(k).to(x.device)
            if len(idx) == 0:  # as the one-pass path: an empty test set scores 0
                local.append(0.0)
                continue
            _, z = forward_all(model, algo, self.data, x[idx])
            local.append(float((z.argmax(1) == y[idx]).float().mean()))
        return {"test_acc": float((logits.argmax(1) == y).float().mean()), "local_test_acc": float(np.mean(local)),
                "feature_norm": float(h.norm(dim=1).mean())}


# --------------------------------------------------------------------------- the run
def run(
    cfg: Config | None = None,
    *,
    resume: bool = False,
    data: ImageData | None = None,
    partition: Partition | None = None,
    callback: Callable[[dict], None] | None = None,
    **overrides: Any,
) -> Result:
    """Run federated training as ``cfg`` says and return a :class:`Result`.

    ``overrides`` replace config fields (``run(cfg, rounds=5)``). ``data`` / ``partition`` reuse
    already-loaded ones (they must match the config). ``resume=True`` continues from
    ``out_dir/checkpoint.pt`` (``rounds`` and ``lr`` may change). ``callback(row)`` is called after
    every evaluated round with the history row (a dict) — for live plots, or to stop a run by raising.

    With ``out_dir``, the run owns that folder while it runs (:func:`feddr_kit.rundir.claim`): another
    run into it is refused, and so is a fresh run into a folder holding results unless ``cfg.overwrite``.
    ``regularizer=None`` is replaced by the algorithm's own in the returned and saved config.
    """
    cfg = (cfg or Config()).replace(**overrides) if overrides else (cfg or Config())
    if cfg.regularizer is None:  # record the regularizer actually used (fd for feddr+), never None
        cfg = cfg.replace(regularizer=ALGORITHMS[cfg.algorithm].default_regularizer)
    if resume and not cfg.out_dir:
        raise FeddrKitError("resume=True needs out_dir: the folder holding checkpoint.pt")
    device = resolve_device(cfg.device)
    with engine_mod.kernel_settings(cfg.deterministic, device):
        if not cfg.out_dir:
            return _run(cfg, device, None, None, data, partition, callback)
        with rundir.claim(Path(cfg.out_dir), resume=resume, overwrite=cfg.overwrite) as out_dir:
            checkpoint = read_checkpoint(out_dir, cfg) if resume else None
            return _run(cfg, device, out_dir, checkpoint, data, partition, callback)


@dataclass
class RunSetup:
    """What a run builds before round 0, the same for :func:`run` and for the Flower apps
    (:mod:`feddr_kit.flower`), so both start from the same bits.

    ``model`` is the one reusable local model (built right after ``torch.manual_seed(cfg.seed)``,
    the head installed by ``algo.setup``); ``teacher`` a second model of the same architecture that
    holds the round's global model when the algorithm needs it; ``initial_state`` the global state
    before round 0 (detached copies); ``client_idx[k]`` client ``k``'s train indices (int64 ``[n_k]``
    on the device); ``counts`` the clients' train label histograms (float32 ``[K, C]``);
    ``mean_size`` ``N/K`` for the Dirichlet step rule.
    """

    cfg: Config
    device: torch.device
    engine: str
    data: ImageData
    partition: Partition
    algo: Algorithm
    model: Net
    teacher: Net
    lr0: float
    initial_state: dict[str, torch.Tensor]
    client_idx: list[torch.Tensor]
    counts: torch.Tensor
    mean_size: int


def initial_lr(cfg: Config) -> float:
    """The initial lr ``lr0`` of ``cfg``'s schedule: ``cfg.lr``, or when None the algorithm's default for
    the model (:attr:`Algorithm.default_lr`, chosen by ``results/lr_grid.py``)."""
    return cfg.lr if cfg.lr is not None else get_algorithm(cfg).initial_lr(cfg.model)


def beta_scaled_dr(cfg: Config, out_dir: str | None = None) -> Config:
    """The control arm of a FedDr+ comparison: plain DR (no regularizer) at ``lr0 · β``, all else as ``cfg``.

    FedDr+'s loss is ``β·L_DR + (1-β)·L_FD``. When the FD term's gradient is negligible (features of
    small norm; see :mod:`feddr_kit.instruments`), FedDr+ is DR with its step scaled by β, and a
    FedDr+ gain over DR may be nothing but a smaller step. A claim about feature distillation holds
    only if FedDr+ also beats this control. ``cfg`` is a FedDr+ config (``algorithm="feddr+"``, or
    ``"dr"`` with ``regularizer="fd"``); ``lr0`` is :func:`initial_lr`'s. Returns a new config, with
    ``out_dir`` (default None: nothing saved) so that it never writes into the FedDr+ run's folder.
    """
    is_feddr = (cfg.algorithm == "feddr+" and cfg.regularizer in (None, "fd")) or \
        (cfg.algorithm == "dr" and cfg.regularizer == "fd")
    if not is_feddr:
        raise FeddrKitError(f"beta_scaled_dr: the control is defined for FedDr+ (algorithm='feddr+', or 'dr' with "
                            f"regularizer='fd'), got algorithm={cfg.algorithm!r}, regularizer={cfg.regularizer!r}")
    if cfg.beta == 0:
        raise FeddrKitError("beta_scaled_dr: beta=0 leaves no DR term, so its control would train at lr 0; "
                            "compare beta=0 with DR directly")
    return cfg.replace(algorithm="dr", regularizer="none", lr=initial_lr(cfg) * cfg.beta, out_dir=out_dir)


def build_teacher(model: str, num_classes: int, algo: Algorithm, device: torch.device) -> Net:
    """A frozen (eval, no grad) ``model`` of the global model's architecture after ``algo.adapt_model``
    (FedETF's projection): the distillation teacher and the probes' view of the global model. Load the
    global state into it before use (:func:`load_teacher`)."""
    teacher = build_model(model, num_classes, head_bias=algo.head_bias).to(device)
    algo.adapt_model(teacher)
    return teacher.eval().requires_grad_(False)


def prepare(cfg: Config, device: torch.device, data: ImageData | None = None,
            partition: Partition | None = None) -> RunSetup:
    """Build a run's data, partition, algorithm, models and initial global state (see :class:`RunSetup`).

    Seeds ``torch`` with ``cfg.seed`` before the model is built, so every caller gets the same
    initial weights. ``data`` / ``partition`` reuse already-loaded ones (checked against ``cfg``).
    """
    engine = engine_mod.resolve_engine(cfg.engine, device)
    data = (data or load_data(cfg)).to(device)
    part = partition if partition is not None else make_partition(cfg, data)
    check_partition(part, data, cfg)
    torch.manual_seed(cfg.seed)
    algo = get_algorithm(cfg)
    model = build_model(cfg.model, data.num_classes, head_bias=algo.head_bias,
                        image_size=data.image_shape[1:]).to(device)
    algo.setup(model, cfg.seed)
    lr0 = initial_lr(cfg)
    teacher = build_teacher(cfg.model, data.num_classes, algo, device)
    initial_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    client_idx = [torch.from_numpy(t.astype(np.int64)).to(device) for t in part.train_indices]
    counts = torch.from_numpy(part.counts("train")).float().to(device)
    return RunSetup(cfg, device, engine, data, part, algo, model, teacher, lr0, initial_state, client_idx, counts,
                    len(data.train_y) // cfg.num_clients)


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


def client_context(setup: RunSetup, client: int, round: int, lr: float,
                   global_state: dict[str, torch.Tensor], measure: bool = False) -> ClientContext:
    """The :class:`ClientContext` of ``client`` in round ``round`` at ``lr``, from the received ``global_state``.

    ``measure``: record the regularizer:task gradient ratios of its steps in ``ctx.gradients`` (the
    evaluated rounds, :attr:`RoundPlan.evaluating`); nothing is recorded without a regularizer.
    """
    n = len(setup.partition.train_indices[client])
    gradients = instruments.GradientRatios() if measure and setup.algo.regularizer != "none" else None
    return ClientContext(client=client, round=round, lr=lr, num_samples=n,
                         num_steps=setup.algo.num_local_steps(local_steps(n, setup.cfg, setup.mean_size)),
                         class_counts=setup.counts[client], global_state=global_state, gradients=gradients)


def train_clients(setup: RunSetup, ctxs: list[ClientContext], engine: str | None = None
                  ) -> Iterator[tuple[ClientContext, float, dict]]:
    """Train clients from the received global state (``ctxs[i].global_state``, the same for all).

    Yields ``(ctx, mean local loss, upload)`` per client in order, with ``setup.model`` then holding
    that client's final local state (read it before the next ``next``); ``upload`` is
    ``algo.client_end``'s dict (typed by ``Algorithm.uploads``). ``setup.teacher`` must already hold
    the global state when ``algo.needs_teacher`` (:func:`load_teacher`). ``engine``: default the run's.
    """
    trained = engine_mod.train_round(engine or setup.engine, setup.model, setup.teacher, setup.algo, setup.data,
                                     [setup.client_idx[c.client] for c in ctxs], ctxs, setup.cfg, setup.device)
    for ctx, loss in zip(ctxs, trained):
        yield ctx, loss, setup.algo.client_end(setup.model, ctx)


def load_teacher(setup: RunSetup, global_state: dict[str, torch.Tensor]) -> None:
    """Load the round's global state into ``setup.teacher`` (the distillation teacher, the probes' global view)."""
    setup.teacher.load_state_dict(global_state)


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


def evaluate_global(setup: RunSetup, evaluator: "Evaluator", global_state: dict[str, torch.Tensor], plan: RoundPlan,
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


def finish_round(setup: RunSetup, global_state: dict[str, torch.Tensor], round: int) -> None:
    """What follows a round's aggregation before its evaluation: after the last round, the algorithm's
    ``after_training`` (SphereFed's head calibration) on the scratch ``setup.model``."""
    if round == setup.cfg.rounds - 1:
        setup.algo.after_training(setup.model, global_state, setup.data, setup.partition)


def _run(cfg: Config, device: torch.device, out_dir: Path | None, checkpoint: dict | None, data: ImageData | None,
         partition: Partition | None, callback: Callable[[dict], None] | None) -> Result:
    """:func:`run` under its kernel settings, once ``out_dir`` (or None) is owned and, when resuming,
    its ``checkpoint`` read."""
    setup = prepare(cfg, device, data, partition)
    data, part, algo, model = setup.data, setup.partition, setup.algo, setup.model
    global_state = setup.initial_state
    local_state = model.state_dict()  # views of the live parameters

    start, rows, round_seconds = 0, [], []
    if checkpoint is not None:
        start, global_state, rows, round_seconds = _restore(checkpoint, algo, device)
    if out_dir is not None:
        write_text(out_dir / "config.json", cfg.to_json() + "\n")

    counts = setup.counts
    evaluator = Evaluator(data, part, cfg.seed)
    probe = probe_set(data, cfg.probe_samples, cfg.seed, model) if cfg.probes else None

    bar = tqdm(range(start, cfg.rounds), desc=f"{cfg.algorithm}", disable=not cfg.progress,
               initial=start, total=cfg.rounds, dynamic_ncols=True)
    for t in bar:
        t0 = time.perf_counter()
        plan = plan_round(cfg, setup.lr0, t, part)
        probing = probe is not None and plan.evaluating  # probes are recorded with the evaluated rounds only
        if algo.needs_teacher or probing:
            load_teacher(setup, global_state)
        global_view = probe_view(setup.teacher, algo, data, *probe) if probing else None

        average = new_average(global_state)
        averaged_local = [local_state[n] for n in average]  # live views: they hold each client's weights in turn
        ctxs = [client_context(setup, k, t, plan.lr, global_state, measure=plan.evaluating) for k in plan.clients]
        uploads, losses_, probe_rows = [], [], []
        for (ctx, loss, upload), w in zip(train_clients(setup, ctxs), plan.weights):  # model holds ctx.client's state
            losses_.append(loss)
            uploads.append(upload)
            accumulate(average, averaged_local, w)
            if probing:
                observed = counts[ctx.client] > 0
                probe_rows.append(probes_mod.compare(probe_view(model, algo, data, *probe), global_view, probe[1], observed))

        global_state = next_global_state(algo, global_state, average, uploads, plan.weights, t)
        finish_round(setup, global_state, t)
        seconds = time.perf_counter() - t0

        if plan.evaluating:
            row = evaluate_global(setup, evaluator, global_state, plan, losses_)
            row.update(instruments.round_ratios([c.gradients for c in ctxs]))
            seconds = time.perf_counter() - t0
            row["seconds"] = seconds
            if probe_rows:
                row.update(pd.DataFrame(probe_rows).mean(skipna=True).to_dict())
            rows.append(row)
            bar.set_postfix(acc=f"{row['test_acc']:.3f}", loss=f"{row['train_loss']:.3f}")
            if callback is not None:
                callback(dict(row))
        round_seconds.append(seconds)
        if out_dir is not None and checkpoint_due(cfg, t):
            save_checkpoint(out_dir, t + 1, global_state, algo, rows, round_seconds, cfg)
    bar.close()
    return finish_run(setup, global_state, rows, round_seconds, out_dir)


def checkpoint_due(cfg: Config, round: int) -> bool:
    """Whether a checkpoint is written after round ``round`` (0-based): every ``checkpoint_every`` and at the end."""
    return bool(cfg.checkpoint_every and (round + 1) % cfg.checkpoint_every == 0) or round == cfg.rounds - 1


def finish_run(setup: RunSetup, global_state: dict[str, torch.Tensor], rows: list[dict], round_seconds: list[float],
               out_dir: Path | None) -> Result:
    """The :class:`Result` of a finished run (``setup.model`` in the reported state); writes
    ``summary.json`` to ``out_dir`` when given."""
    setup.model.load_state_dict(setup.algo.eval_state(global_state))
    history = pd.DataFrame(rows)
    summary = summarize(history, round_seconds, setup.cfg, setup.lr0)
    if out_dir is not None:
        write_json(out_dir / "summary.json", summary)
    return Result(setup.cfg, history, summary, setup.model, setup.algo, setup.partition, setup.data, out_dir)


def client_batch(model: Net, teacher: Net | None, algo: Algorithm, x: torch.Tensor, y: torch.Tensor) -> Batch:
    """The :class:`Batch` of a normalized batch ``x`` ``[B,3,H,W]`` with labels ``y`` ``[B]``: ``model``'s
    features and logits, and the teacher's (``teacher`` holds the round's global model) when the
    algorithm needs them."""
    h = model.features(x)
    b = Batch(x=x, y=y, h=h, z=algo.logits(model, h))
    if algo.needs_teacher:
        with torch.no_grad():
            b.h_g = teacher.features(x)
            b.z_g = algo.logits(teacher, b.h_g)
    return b


def client_loss(model: Net, teacher: Net | None, algo: Algorithm, x: torch.Tensor, y: torch.Tensor,
                ctx: ClientContext) -> torch.Tensor:
    """The algorithm's loss (a scalar) of ``model`` on a normalized batch ``x`` ``[B,3,H,W]``, labels ``y`` ``[B]``:
    ``algo.loss`` on :func:`client_batch`. Both engines call it (the batched one under vmap)."""
    return algo.loss(model, client_batch(model, teacher, algo, x, y), ctx)


def measured_terms(model: Net, teacher: Net | None, algo: Algorithm, x: torch.Tensor, y: torch.Tensor,
                   ctx: ClientContext) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`client_loss` of a measured step, with what the instruments need: ``(loss, reg, (‖∂task/∂h‖,
    ‖∂reg/∂h‖))``, all scalars, ``loss`` bit for bit :func:`client_loss`'s (``algo.loss_terms`` summed).
    Both engines call it (the batched one under vmap); the algorithm must have a regularizer."""
    b = client_batch(model, teacher, algo, x, y)
    task, reg = algo.loss_terms(model, b, ctx)

    def terms_of(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return algo.loss_terms(model, dataclasses.replace(b, h=h, z=algo.logits(model, h)), ctx)

    return task + reg, reg, instruments.feature_gradient_norms(terms_of, b.h)


def body_parameter_names(model: Net) -> list[str]:
    """Names of the body's trainable parameters (``body.…``, in ``named_parameters`` order): where the
    instruments measure the gradient ratio with respect to the parameters."""
    return [n for n, p in model.named_parameters() if n.startswith("body.") and p.requires_grad]


def local_step(model: Net, teacher: Net | None, algo: Algorithm, opt: torch.optim.Optimizer,
               x: torch.Tensor, y: torch.Tensor, ctx: ClientContext) -> torch.Tensor:
    """One local SGD step on a normalized batch ``x`` ``[B,3,H,W]`` with labels ``y`` ``[B]``.

    :func:`client_loss`, backward, the algorithm's gradient hook, the optimizer step. When
    ``ctx.gradients`` is set (a measured round of a run with a regularizer), the step also adds its
    gradient ratios to it (:mod:`feddr_kit.instruments`); the update is the same either way.
    Returns the detached loss (a scalar tensor).
    """
    if ctx.gradients is None or algo.regularizer == "none":
        loss = client_loss(model, teacher, algo, x, y, ctx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    else:
        loss, reg, feature_norms = measured_terms(model, teacher, algo, x, y, ctx)
        params = dict(model.named_parameters())
        body = [params[n] for n in body_parameter_names(model)]
        reg_grads = torch.autograd.grad(reg, body, retain_graph=True, allow_unused=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        ctx.gradients.add(feature_norms, instruments.split_norms([p.grad for p in body], reg_grads))
    algo.before_step(model, ctx)
    opt.step()
    return loss.detach()


def train_client(model: Net, teacher: Net, algo: Algorithm, data: ImageData, idx: torch.Tensor,
                  ctx: ClientContext, cfg: Config, device: torch.device) -> float:
    """Local training of one client, from the global state already loaded into ``model``.

    ``idx``: the client's train indices (int64 ``[n]``, on the device); ``ctx.num_steps`` comes
    from :func:`local_steps`. Runs the algorithm's ``client_start`` and then :func:`local_step` on
    each of :func:`local_batches`, with the client's own generator for ``(seed, round, client)``.
    ``teacher`` holds the round's global model when the algorithm needs one. Returns the mean local
    loss; raises ``FloatingPointError`` when it is not finite.
    """
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]  # frozen ones never reach the optimizer
    opt = torch.optim.SGD(params, lr=ctx.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    gen = client_generator(cfg.seed, ctx.round, ctx.client, device)
    ctx.extra["optimizer"] = opt  # for hooks that change the step size between steps (Per-FedAvg)
    algo.client_start(model, ctx)
    total, steps = torch.zeros((), device=device), 0
    for batch_idx in local_batches(idx, cfg, ctx.num_steps, gen):
        total += local_step(model, teacher, algo, opt, data.train_batch(batch_idx, gen), data.train_y[batch_idx], ctx)
        steps += 1
    mean_loss = float(total) / max(steps, 1)
    check_local_loss(mean_loss, ctx)
    return mean_loss


def check_local_loss(mean_loss: float, ctx: ClientContext) -> None:
    """Raise ``FloatingPointError`` when a client's mean local loss is not finite."""
    if not math.isfinite(mean_loss):
        raise DivergedError(
            f"round {ctx.round + 1}, client {ctx.client}: the local loss became {mean_loss} at lr={ctx.lr:g}; "
            "try a smaller learning rate (the last good checkpoint in out_dir is kept: resume from it with a smaller lr)"
        )


def probe_set(data: ImageData, num_samples: int, seed: int, model: Net) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe images (uint8 ``[P,3,H,W]``) and labels ``[P]``: a class-balanced, seeded test subsample
    (:func:`feddr_kit.probes.probe_indices`), in a fixed seeded shuffle for a batch-statistics ``model``
    (so no probe batch holds a single class; see :func:`feddr_kit.models.eval_order`)."""
    pidx = probes_mod.probe_indices(data.test_y, num_samples, seed).to(data.test_y.device)
    if model.batch_stat_norm:
        pidx = pidx[eval_order(len(pidx), seed, 2).to(pidx.device)]
    return data.test_x[pidx], data.test_y[pidx]


def probe_view(model: Net, algo: Algorithm, data: ImageData, x: torch.Tensor, y: torch.Tensor) -> probes_mod.ModelView:
    """What the probes need of one model on the probe images ``x`` (uint8 ``[P,3,H,W]``), labels ``y`` ``[P]``:
    its features, logits and head (see :func:`feddr_kit.probes.view`)."""
    h, z = forward_all(model, algo, data, x)
    return probes_mod.view(h, z, model.head.weight.detach().float(), y)


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


# --------------------------------------------------------------------------- checkpoints
def save_checkpoint(out_dir: Path, next_round: int, global_state: dict, algo: Algorithm, rows: list,
                    round_seconds: list, cfg: Config) -> None:
    """Write ``out_dir/checkpoint.pt`` (global state, algorithm state, history, RNGs) and ``history.csv``."""
    ckpt = {
        "version": 1,
        "next_round": next_round,
        "config": cfg.to_dict(),
        "global_state": {k: v.cpu() for k, v in global_state.items()},
        "algorithm_state": algo.state_dict(),
        "history": rows,
        "round_seconds": round_seconds,
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
    }
    atomic_write(out_dir / CHECKPOINT, lambda tmp: torch.save(ckpt, tmp))
    write_text(out_dir / "history.csv", pd.DataFrame(rows).to_csv(index=False))



# Keys a checkpoint must hold to be resumed from.
CHECKPOINT_KEYS = ("next_round", "config", "global_state", "algorithm_state", "history", "round_seconds",
                   "torch_rng", "numpy_rng")


def read_checkpoint(out_dir: Path, cfg: Config) -> dict:
    """Read ``out_dir/checkpoint.pt`` for a resume of ``cfg`` and check that ``cfg`` may continue it.

    Raises :class:`FeddrKitError` (one line, the file left in place) when it is missing or
    unreadable, when a field outside :data:`RESUMABLE_CHANGES` differs, or when ``cfg.rounds`` is
    below the rounds already done. A changed ``rounds`` or ``lr`` is announced with a warning.
    """
    path = out_dir / CHECKPOINT
    if not path.exists():
        raise FeddrKitError(f"resume=True but there is no checkpoint at {path}; run without resume first")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        missing = [k for k in CHECKPOINT_KEYS if k not in ckpt]
    except Exception as err:  # truncated, not a torch file, not a dict: all mean the same to the user
        reason = (str(err).splitlines() or [type(err).__name__])[0][:120]
        raise FeddrKitError(f"resume: {path} is unreadable ({type(err).__name__}: {reason}); it was left in place, "
                            "move it away to start afresh with overwrite") from None
    if missing:
        raise FeddrKitError(f"resume: {path} is unreadable (not a feddr_kit checkpoint: no {', '.join(missing)}); "
                            "it was left in place, move it away to start afresh with overwrite")
    saved = dict(ckpt["config"])
    if saved.get("regularizer") is None and saved.get("algorithm") in ALGORITHMS:  # checkpoints of older versions
        saved["regularizer"] = ALGORITHMS[saved["algorithm"]].default_regularizer
    for name, value in cfg.to_dict().items():
        if name not in RESUMABLE_CHANGES and saved.get(name, value) != value:
            raise FeddrKitError(
                f"resume: config field {name} is {value!r} but the checkpoint was made with {saved.get(name)!r}; "
                f"only {', '.join(sorted(RESUMABLE_CHANGES))} may change on resume"
            )
    done = ckpt["next_round"]
    if cfg.rounds < done:
        raise FeddrKitError(f"rounds: {done} rounds are already done in {path}; resume with rounds >= {done}")
    if saved["rounds"] != cfg.rounds:
        warnings.warn(f"resuming with rounds={cfg.rounds} instead of {saved['rounds']}: the lr schedule is recomputed",
                      stacklevel=3)
    if saved.get("lr") != cfg.lr:
        warnings.warn(f"resuming with lr={cfg.lr} instead of {saved.get('lr')} from round {done + 1} on",
                      stacklevel=3)
    return ckpt


def _restore(ckpt: dict, algo: Algorithm, device: torch.device):
    """Load a checkpoint read by :func:`read_checkpoint`: algorithm state and RNGs; returns
    ``(next_round, global_state, history_rows, round_seconds)``."""
    algo.load_state_dict(ckpt["algorithm_state"])
    torch.set_rng_state(ckpt["torch_rng"])
    np.random.set_state(ckpt["numpy_rng"])
    state = {k: v.to(device) for k, v in ckpt["global_state"].items()}
    return ckpt["next_round"], state, list(ckpt["history"]), list(ckpt["round_seconds"])
