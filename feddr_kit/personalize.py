"""Personalization after (or instead of) federated training: the "-FT" protocol and local-only baselines.

* :func:`finetune`: from a finished global-model run, every client copies the global model, is
  evaluated on its own test set ("before"), fine-tunes on its own training set with the method's own
  loss and frozen parts, and is evaluated again ("after"). FedDr+ FT uses L_Dr+ with the global
  model as the feature teacher. FedETF can use its original personalization instead
  (``protocol="fedetf"``, :meth:`feddr_kit.methods.FedETF.personalization_phases`).
* :func:`local_only`: each client trains alone from the common initialization, for the local steps
  it would take in expectation during the federated run (CE, CE with an ETF-initialized head, DR).

Both train every client with the shared :func:`feddr_kit.local.train_client` and return a
:class:`PersonalResult`: one row per client, and mean ± std over clients. The per-client test sets are
the partition's. The 1-step personalized methods (FedPer, FedRep, Per-FedAvg, Ditto) are algorithms on
the round loop instead: see feddr_kit/methods/personalized.py.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from . import heads, local
from . import progress as progress_mod
from .build import build_algorithm
from .clients import Clients, data_and_partition
from .config import Config
from .data import ImageData
from .errors import FeddrKitError, StorageError, report
from .evaluation import Evaluator
from .local import ClientContext, build_teacher, client_context
from .methods import ALGORITHMS, Algorithm, CrossEntropyOf, resolve_regularizer
from .models import Net
from .partition import Partition
from .roundlog import Result
from .rundir import CHECKPOINT, load_checkpoint, make_folder, read_json, writable_folder, write_json, write_text
from .schedule import lr_at
from .streams import FEDETF_PHASES_ROUND, FINETUNE_ROUND, LOCAL_ONLY_ROUND, client_generator

LOCAL_LOSSES = {"ce": "fedavg", "ce_etf": "fedavg", "dr": "dr"}
LOCAL_SCHEDULES = ("kit", "reference")
# The reference code's local-only protocol: 160 epochs at lr 0.1, ×0.1 at epochs 80 and 120.
REFERENCE_LOCAL_EPOCHS, REFERENCE_LOCAL_LR = 160, 0.1
PROTOCOLS = ("generic", "fedetf")
FT_STREAM, LOCAL_STREAM = FINETUNE_ROUND, LOCAL_ONLY_ROUND  # the names these streams had here


@dataclass
class PersonalResult:
    """Per-client accuracies of one personalization.

    ``per_client``: one row per client: ``client``, ``n_train``, ``n_test``, ``before`` (the global
    model on the client's test set; NaN for local-only), ``after`` (the personalized model).
    ``method``: what was run (e.g. ``"feddr+-FT"``, ``"local-dr"``); ``info``: its settings.
    """

    method: str
    per_client: pd.DataFrame
    info: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Mean and std over clients of ``before`` and ``after``, with :attr:`info`."""
        b, a = self.per_client["before"], self.per_client["after"]
        return {"method": self.method, "before_mean": float(b.mean()), "before_std": float(b.std(ddof=0)),
                "after_mean": float(a.mean()), "after_std": float(a.std(ddof=0)),
                "gain_mean": float((a - b).mean()), **self.info}

    def __repr__(self) -> str:
        s = self.summary()
        before = "" if np.isnan(s["before_mean"]) else f"before {s['before_mean']:.2%} ± {s['before_std']:.2%}, "
        return f"PersonalResult({self.method}: {before}after {s['after_mean']:.2%} ± {s['after_std']:.2%}, " \
               f"{len(self.per_client)} clients)"


# --------------------------------------------------------------------------- loading a finished run
def load_finished(result_or_state: Any) -> tuple[Config, dict[str, torch.Tensor], dict | None, Any]:
    """The config, the reported global state, the algorithm state (or None) and the data/partition
    (or None) of a finished run given as an ``fk.Result``, a run folder (``config.json`` +
    ``checkpoint.pt``) or a checkpoint dict (``{"config", "global_state", ...}``)."""
    if isinstance(result_or_state, Result):
        r = result_or_state
        state = {k: v.detach().clone() for k, v in r.model.state_dict().items()}
        return r.config, state, None, (r.data, r.partition)
    if isinstance(result_or_state, (str, Path)):
        folder = Path(result_or_state)
        if not (folder / CHECKPOINT).exists() or not (folder / "config.json").exists():
            raise FeddrKitError(f"result_or_state: {folder} is not a finished run folder (no config.json and "
                                f"{CHECKPOINT}); pass an fk.Result, a run folder or a checkpoint dict")
        saved = read_json(folder / "config.json", "result_or_state")
        if not isinstance(saved, dict):
            raise FeddrKitError(f"result_or_state: {folder / 'config.json'} holds no config (not a JSON object)")
        try:
            cfg = Config.from_dict(saved)
        except FeddrKitError as err:
            raise FeddrKitError(f"result_or_state: {folder / 'config.json'}: {err}") from None
        ckpt = load_checkpoint(folder / CHECKPOINT, "result_or_state",
                               "so it cannot be fine-tuned: run that run again to write a new one")
    elif isinstance(result_or_state, dict) and {"config", "global_state"} <= set(result_or_state):
        ckpt = result_or_state
        cfg = Config.from_dict(dict(ckpt["config"]))
    else:
        raise FeddrKitError("result_or_state must be an fk.Result, a run folder or a checkpoint dict with "
                            f"config and global_state, got {type(result_or_state).__name__}")
    if ckpt.get("next_round", cfg.rounds) < cfg.rounds:
        raise FeddrKitError(f"result_or_state: the run stopped after {ckpt['next_round']} of {cfg.rounds} rounds; "
                            "fine-tune a finished run (resume it first)")
    return cfg, ckpt["global_state"], ckpt.get("algorithm_state"), None


# --------------------------------------------------------------------------- the FT protocol
def finetune(result_or_state: Any, method: str | None = None, epochs: int = 5, lr: float | None = None, *,
             protocol: str = "generic", train_head: bool | None = None, batch_size: int = 50,
             data: ImageData | None = None, partition: Partition | None = None, device: str = "cpu",
             fedetf_alternations: int = 20, clients: Iterable[int] | None = None,
             progress: bool = False) -> PersonalResult:
    """Fine-tune the global model of a finished run on every client and evaluate it on each client's own
    test set before and after.

    ``result_or_state``: an ``fk.Result``, a finished run folder or a checkpoint dict. ``method``: the
    algorithm whose local loss and frozen parts the fine-tuning uses (default the run's own; it must
    build the same model). ``epochs`` × ⌈n_k/``batch_size``⌉ SGD steps per client (momentum 0.9, no
    weight decay, drawn by the kit's local rule: shuffled epochs, or random batches on Dirichlet),
    at ``lr`` (default: the run's last-round lr, as the protocol). Frozen parts: a fixed geometric
    head (ETF, orthonormal) stays frozen; a learned head, and FedBABU's random head, are fine-tuned
    (FedBABU-FT fine-tunes its head); ``train_head`` overrides. Fine-tuning with a teacher (FedDr+'s
    feature distillation) uses the global model as the teacher.

    ``protocol="fedetf"`` (a FedETF run only) is FedETF's own personalization: one local update of
    ``epochs`` epochs of its balanced loss, then ``fedetf_alternations`` × its phases
    (:meth:`feddr_kit.methods.FedETF.personalization_phases`: 3 epochs of the ETF ``V`` only, 3 epochs of
    the projection only), both with plain CE; evaluated on the client's test set (not the original's
    30 % split).

    ``data`` / ``partition``: reuse loaded ones (default: the run's, or loaded from its config).
    ``clients``: the client ids to fine-tune, in that order (default every client). Each client starts
    from the global model and draws from its own random stream, so a client's row does not depend on
    which others are fine-tuned with it.
    Returns a :class:`PersonalResult` (method ``"<algorithm>-FT"``), one row per fine-tuned client.
    """
    _check_finetune(protocol, epochs, lr, method)
    cfg, state, algo_state, loaded = load_finished(result_or_state)
    if protocol == "fedetf" and cfg.algorithm != "fedetf":
        raise FeddrKitError(f"protocol='fedetf' fine-tunes a FedETF run, but this run's algorithm is {cfg.algorithm!r}")
    dev = torch.device(device)
    if loaded is not None:
        data, partition = data or loaded[0], partition if partition is not None else loaded[1]
    data, part = data_and_partition(cfg, dev, data, partition)
    global_state, run_lr = _reported(cfg, state, algo_state, data, dev)
    ft_lr = float(lr) if lr is not None else run_lr
    ft_cfg = resolve_regularizer(cfg.replace(algorithm=method or cfg.algorithm, regularizer=None if method else cfg.regularizer,
                                             batch_size=batch_size, momentum=0.9, weight_decay=0.0))
    algo, model, teacher = _finetuned_model(ft_cfg, cfg, data, dev, global_state)
    head_trained = train_head if train_head is not None else not algo.geometric_head
    for p in model.head.parameters():
        p.requires_grad_(bool(head_trained))

    chosen = _chosen_clients(clients, part)
    evaluator = Evaluator(data, part, cfg.seed)
    pool = Clients.of(data, part, dev)
    rows = []
    for k in progress_mod.each(chosen, f"{cfg.algorithm}-FT", unit="clients", disable=not progress):
        model.load_state_dict(global_state)
        before = evaluator.client_accuracy(model, algo, k)
        n = pool.size(k)
        ctx = client_context(algo, ft_cfg, pool, k, FINETUNE_ROUND, ft_lr, global_state,
                             num_steps=epochs * -(-n // batch_size))
        if protocol == "fedetf":
            _fedetf_personalize(model, algo, data, pool.indices[k], ctx, ft_cfg, dev, fedetf_alternations)
        elif ctx.num_steps > 0:
            local.train_client(model, teacher, algo, data, pool.indices[k], ctx, ft_cfg, dev)
        rows.append({"client": k, "n_train": n, "n_test": len(part.test_indices[k]), "before": before,
                     "after": evaluator.client_accuracy(model, algo, k)})
    info = {"algorithm": cfg.algorithm, "ft_method": ft_cfg.algorithm, "protocol": protocol, "epochs": epochs,
            "lr": ft_lr, "head_trained": bool(head_trained), "seed": cfg.seed}
    return PersonalResult(f"{cfg.algorithm}-FT", pd.DataFrame(rows), info)


def _chosen_clients(clients: Iterable[int] | None, part: Partition) -> list[int]:
    """``clients`` as a list of distinct client ids of ``part`` (every client when None), or
    :class:`FeddrKitError` naming the first bad one."""
    if clients is None:
        return list(range(part.num_clients))
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Iterable):
        raise FeddrKitError(f"clients must be client ids (e.g. range(10)) or None for every client, got {clients!r}")
    chosen = [part.client_id(k, "clients") for k in clients]
    if len(set(chosen)) != len(chosen):
        raise FeddrKitError(f"clients: each client once, got {chosen}")
    return chosen


def _check_finetune(protocol: str, epochs: Any, lr: Any, method: str | None) -> None:
    """Raise :class:`FeddrKitError` for a bad argument of :func:`finetune`."""
    if protocol not in PROTOCOLS:
        raise FeddrKitError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 0:
        raise FeddrKitError(f"epochs must be an integer >= 0, got {epochs!r}")
    if lr is not None and not (isinstance(lr, (int, float)) and lr > 0):
        raise FeddrKitError(f"lr must be a number > 0 or None (the run's last-round lr), got {lr!r}")
    if method is not None and (method not in ALGORITHMS or ALGORITHMS[method].personalized):
        raise FeddrKitError(f"method must be a global-model algorithm ({', '.join(a for a in ALGORITHMS if not ALGORITHMS[a].personalized)}) "
                            f"or None for the run's own, got {method!r}")


def _reported(cfg: Config, state: dict[str, torch.Tensor], algo_state: dict | None, data: ImageData,
              device: torch.device) -> tuple[dict[str, torch.Tensor], float]:
    """The finished run's reported global state on ``device`` (its algorithm's ``eval_state`` when the
    algorithm's state is known) and its last round's lr."""
    run_algo, _ = build_algorithm(cfg, data, device)
    if algo_state is not None:
        run_algo.load_state_dict(algo_state)
        state = run_algo.eval_state({k: v.to(device) for k, v in state.items()})
    return {k: v.to(device) for k, v in state.items()}, lr_at(cfg, run_algo.lr0, cfg.rounds - 1)


def _finetuned_model(ft_cfg: Config, cfg: Config, data: ImageData, device: torch.device,
                     global_state: dict[str, torch.Tensor]) -> tuple[Algorithm, Net, Net | None]:
    """The fine-tuning algorithm, its model holding ``global_state``, and its teacher (the global model,
    when the algorithm needs one, else None); a :class:`FeddrKitError` when ``ft_cfg``'s method builds
    another model than the run's."""
    algo, model = build_algorithm(ft_cfg, data, device)
    missing = set(model.state_dict()) ^ set(global_state)
    if missing:
        raise FeddrKitError(f"method: {ft_cfg.algorithm!r} builds a different model than the run's {cfg.algorithm!r} "
                            f"(parameters {', '.join(sorted(missing))}); use the run's own method")
    model.load_state_dict(global_state)
    teacher = None
    if algo.needs_teacher:
        teacher = build_teacher(ft_cfg.model, data.num_classes, algo, device)
        teacher.load_state_dict(global_state)
    return algo, model, teacher


def _fedetf_personalize(model: Net, algo: Algorithm, data: ImageData, idx: torch.Tensor, ctx: ClientContext,
                        cfg: Config, device: torch.device, alternations: int) -> None:
    """FedETF's personalization of one client, in place on ``model`` (holding the global state): one
    ordinary local update, then ``alternations`` × the algorithm's phases, each training one tensor alone
    with plain cross-entropy (:class:`feddr_kit.methods.CrossEntropyOf`) on shuffled epochs, all drawn from
    one generator of the client."""
    if ctx.num_steps > 0:
        local.train_client(model, None, algo, data, idx, ctx, cfg, device)  # one normal local update
    steps = algo.personalization_epochs_per_phase * -(-len(idx) // cfg.batch_size)
    gen = client_generator(cfg.seed, FEDETF_PHASES_ROUND, ctx.client, device)
    plain = CrossEntropyOf(algo)
    saved = {n: p.requires_grad for n, p in model.named_parameters()}
    for _ in range(alternations):
        for param, lr, momentum, wd in algo.personalization_phases(model):
            for p in model.parameters():
                p.requires_grad_(p is param)
            phase_cfg = cfg.replace(partition="iid", momentum=momentum, weight_decay=wd)
            local.train_client(model, None, plain, data, idx, dataclasses.replace(ctx, lr=lr, num_steps=steps),
                               phase_cfg, device, gen=gen)
    for n, p in model.named_parameters():
        p.requires_grad_(saved[n])


# --------------------------------------------------------------------------- local-only baselines
def local_only(cfg: Config, loss: str = "ce", *, epochs: float | None = None, lr: float | None = None,
               schedule: str = "kit", data: ImageData | None = None, partition: Partition | None = None,
               device: str = "cpu", progress: bool = False) -> PersonalResult:
    """Train every client alone from the common initialization of ``cfg.seed`` and evaluate it on its own test set.

    ``loss``: ``"ce"`` (cross-entropy, learned head), ``"ce_etf"`` (cross-entropy, the head initialized
    to the simplex ETF and then trained, bias zero) or ``"dr"`` (dot-regression against the frozen ETF).
    Budget: by default the local steps the client takes in expectation during ``cfg``'s federated run,
    ``rounds · clients_per_round / num_clients`` visits of :func:`feddr_kit.local.local_steps` each (at least
    one step); ``epochs`` instead gives ``epochs`` × one visit's steps. ``lr``: constant, default the
    loss's algorithm's default lr (``cfg.lr`` when set). Momentum and weight decay are ``cfg``'s.

    ``schedule="reference"`` is the FedDr+ reference code's local-only protocol instead: ``epochs`` (default
    160) shuffled epochs at ``lr`` (default 0.1), multiplied by 0.1 at 1/2 and 3/4 of them (epochs 80 and
    120), each client evaluated on its test set after every epoch and reported at its **best** epoch
    (column ``best_epoch``). Choosing the epoch by test accuracy is optimistic: it reads the test set it
    reports on. The optimizer (and its momentum) starts afresh every epoch.
    Returns a :class:`PersonalResult` (method ``"local-<loss>"``; ``before`` is NaN).
    """
    if schedule not in LOCAL_SCHEDULES:
        raise FeddrKitError(f"schedule must be one of {', '.join(LOCAL_SCHEDULES)}, got {schedule!r}")
    if loss not in LOCAL_LOSSES:
        raise FeddrKitError(f"loss must be one of {', '.join(LOCAL_LOSSES)}, got {loss!r}")
    if epochs is not None and not (isinstance(epochs, (int, float)) and epochs > 0):
        raise FeddrKitError(f"epochs must be a number > 0 or None (the federated run's expected budget), got {epochs!r}")
    dev = torch.device(device)
    lcfg = cfg.replace(algorithm=LOCAL_LOSSES[loss], regularizer="none")
    data, part = data_and_partition(lcfg, dev, data, partition)
    algo, model = build_algorithm(lcfg, data, dev)
    if loss == "ce_etf":
        with torch.no_grad():
            model.head.weight.copy_(heads.simplex_etf(model.num_classes, model.feature_dim, lcfg.seed))
            if model.head.bias is not None:
                model.head.bias.zero_()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    lr_used = float(lr) if lr is not None else algo.lr0
    visits = lcfg.rounds * lcfg.clients_per_round / lcfg.num_clients if epochs is None else epochs
    evaluator = Evaluator(data, part, lcfg.seed)
    clients = Clients.of(data, part, dev)
    rows = []
    if schedule == "reference":
        return _local_only_reference(lcfg, loss, algo, model, init, data, part, dev, epochs, lr, progress)
    for k in progress_mod.each(range(part.num_clients), f"local-{loss}", unit="clients", disable=not progress):
        model.load_state_dict(init)
        n = clients.size(k)
        steps = max(1, round(visits * local.local_steps(n, lcfg, clients.mean_size)))
        ctx = client_context(algo, lcfg, clients, k, LOCAL_ONLY_ROUND, lr_used, init, num_steps=steps)
        local.train_client(model, None, algo, data, clients.indices[k], ctx, lcfg, dev)
        rows.append({"client": k, "n_train": n, "n_test": len(part.test_indices[k]), "before": float("nan"),
                     "after": evaluator.client_accuracy(model, algo, k), "steps": steps})
    info = {"loss": loss, "lr": lr_used, "visits": visits, "seed": lcfg.seed}
    return PersonalResult(f"local-{loss}", pd.DataFrame(rows), info)


def _local_only_reference(lcfg: Config, loss: str, algo: Algorithm, model: Net, init: dict[str, torch.Tensor],
                          data: ImageData, part: Partition, device: torch.device, epochs: float | None,
                          lr: float | None, progress: bool) -> PersonalResult:
    """:func:`local_only` with ``schedule="reference"``: every client trains ``epochs`` shuffled epochs from
    ``init`` at a step-decayed lr and is reported at its best epoch by test accuracy."""
    total = int(epochs) if epochs is not None else REFERENCE_LOCAL_EPOCHS
    lr0 = float(lr) if lr is not None else REFERENCE_LOCAL_LR
    ecfg = lcfg.replace(partition="iid")  # whole shuffled epochs, whatever the partition's batch rule
    evaluator = Evaluator(data, part, lcfg.seed)
    clients = Clients.of(data, part, device)
    rows = []
    for k in progress_mod.each(range(part.num_clients), f"local-{loss}", unit="clients", disable=not progress):
        model.load_state_dict(init)
        n, idx = clients.size(k), clients.indices[k]
        gen = client_generator(lcfg.seed, LOCAL_ONLY_ROUND, k, device)
        best, best_epoch = -1.0, 0
        for e in range(total):
            lr_e = lr0 * 0.1 ** ((e >= total // 2) + (e >= total * 3 // 4))
            ctx = client_context(algo, ecfg, clients, k, LOCAL_ONLY_ROUND, lr_e, init, num_steps=-(-n // ecfg.batch_size))
            local.train_client(model, None, algo, data, idx, ctx, ecfg, device, gen=gen)
            acc = evaluator.client_accuracy(model, algo, k)
            if acc > best:
                best, best_epoch = acc, e + 1
        rows.append({"client": k, "n_train": n, "n_test": len(part.test_indices[k]), "before": float("nan"),
                     "after": best, "best_epoch": best_epoch})
    info = {"loss": loss, "lr": lr0, "epochs": total, "schedule": "reference", "seed": lcfg.seed}
    return PersonalResult(f"local-{loss}", pd.DataFrame(rows), info)


# --------------------------------------------------------------------------- saving and the command line
PER_CLIENT, SUMMARY = "per_client.csv", "summary.json"
METHODS = ("finetune", "local-only")


def save(result: PersonalResult, folder: str | Path) -> Path:
    """Write ``result``'s per-client accuracies (``per_client.csv``: client, n_train, n_test, before,
    after, as fractions) and its :meth:`PersonalResult.summary` (``summary.json``) into ``folder``, each
    atomically; returns the folder. One-line :class:`FeddrKitError` when the folder cannot be made,
    :class:`~feddr_kit.errors.StorageError` when a write fails (then neither file is left)."""
    folder = Path(folder)
    make_folder(folder, "folder")
    write_text(folder / PER_CLIENT, result.per_client.to_csv(index=False))
    try:
        write_json(folder / SUMMARY, result.summary())
    except StorageError:  # a table without its summary would pass for a finished personalization
        (folder / PER_CLIENT).unlink(missing_ok=True)
        raise
    return folder


def _saved_config(run_dir: Path) -> Config:
    """The Config in ``run_dir/config.json``; one line when there is none or it is broken."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise FeddrKitError(f"--run: {run_dir} holds no config.json; give a run folder")
    return Config.from_saved(read_json(path, "--run"), path, "--run")


def main(args: dict[str, Any]) -> int:
    """``python -m feddr_kit personalize --run RUN_DIR --method finetune|local-only``: personalize, save
    (:func:`save`, into ``--out``, default ``RUN_DIR/personalize-<method>``) and print the summary. The
    output folder is checked before any client trains. Returns 0, 1 when training diverged, 2 on bad input (a
    broken run folder, an output folder that cannot be written), 3 when a write fails."""
    run_dir = Path(args["run"])
    out = Path(args["out"]) if args.get("out") else run_dir / f"personalize-{args['method']}"
    progress = not args.get("no_progress", False)
    try:
        with writable_folder(out, "--out"):
            if args["method"] == "finetune":
                epochs = args.get("epochs")
                epochs = 5 if epochs is None else int(epochs) if float(epochs).is_integer() else epochs  # finetune's own check words the rest
                result = finetune(run_dir, args.get("ft_algorithm"), epochs=epochs, lr=args.get("lr"),
                                  device=args["device"], progress=progress)
            else:
                result = local_only(_saved_config(run_dir), args["loss"], epochs=args.get("epochs"), lr=args.get("lr"),
                                    device=args["device"], progress=progress)
            save(result, out)
    except FeddrKitError as err:
        return report(err)
    s = result.summary()
    before = "" if np.isnan(s["before_mean"]) else f"before {s['before_mean']:.2%} ± {s['before_std']:.2%}, "
    print(f"{s['method']}: mean client accuracy {before}after {s['after_mean']:.2%} ± {s['after_std']:.2%} "
          f"over {len(result.per_client)} clients")
    print(f"results in {out}/ ({PER_CLIENT}, {SUMMARY})")
    return 0
