"""Personalization after (or instead of) federated training: the "-FT" protocol and local-only baselines.

* :func:`finetune` — spec §12.5: from a finished global-model run, every client copies the global
  model, is evaluated on its own test set ("before"), fine-tunes on its own training set with the
  method's own loss and frozen parts, and is evaluated again ("after"). FedDr+ FT uses L_Dr+ with the
  global model as the feature teacher. FedETF can use its original personalization instead (§9).
* :func:`local_only` — each client trains alone from the common initialization, for the local steps
  it would take in expectation during the federated run (CE, CE with an ETF-initialized head, DR).

Both return a :class:`PersonalResult`: one row per client, and mean ± std over clients. The
per-client test sets are the partition's (spec §11.3). The 1-step personalized methods (FedPer,
FedRep, Per-FedAvg, Ditto) are algorithms on the round loop instead: see feddr_kit/pfl.py.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import heads
from . import federated as fed
from .algorithms import ALGORITHMS, Algorithm, ClientContext, get_algorithm
from .config import Config
from .data import ImageData
from .errors import FeddrKitError
from .models import Net, build_model
from .partition import Partition

LOCAL_LOSSES = {"ce": "fedavg", "ce_etf": "fedavg", "dr": "dr"}
PROTOCOLS = ("generic", "fedetf")
# Generator streams of fine-tuning and local-only training: apart from any round's stream (seed, round, client).
FT_STREAM, LOCAL_STREAM = 2_000_003, 2_000_004


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
    if isinstance(result_or_state, fed.Result):
        r = result_or_state
        state = {k: v.detach().clone() for k, v in r.model.state_dict().items()}
        return r.config, state, None, (r.data, r.partition)
    if isinstance(result_or_state, (str, Path)):
        folder = Path(result_or_state)
        if not (folder / fed.CHECKPOINT).exists() or not (folder / "config.json").exists():
            raise FeddrKitError(f"result_or_state: {folder} is not a finished run folder (no config.json and "
                                f"{fed.CHECKPOINT}); pass an fk.Result, a run folder or a checkpoint dict")
        cfg = Config.from_dict(json.loads((folder / "config.json").read_text()))
        ckpt = torch.load(folder / fed.CHECKPOINT, map_location="cpu", weights_only=False)
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


def _model_for(cfg: Config, data: ImageData, device: torch.device) -> tuple[Algorithm, Net]:
    """The algorithm of ``cfg`` and a model set up as its run's (architecture, fixed head), on ``device``."""
    torch.manual_seed(cfg.seed)
    algo = get_algorithm(cfg)
    model = build_model(cfg.model, data.num_classes, head_bias=algo.head_bias,
                        image_size=data.image_shape[1:]).to(device)
    algo.setup(model, cfg.seed)
    return algo, model


def _client_indices(part: Partition, device: torch.device) -> list[torch.Tensor]:
    return [torch.from_numpy(np.asarray(t, dtype=np.int64)).to(device) for t in part.train_indices]


def _context(cfg: Config, algo: Algorithm, part: Partition, k: int, counts: torch.Tensor, lr: float,
             num_steps: int, stream: int, global_state: dict) -> ClientContext:
    return ClientContext(client=k, round=stream, lr=lr, num_samples=len(part.train_indices[k]), num_steps=num_steps,
                         class_counts=counts[k], global_state=global_state)


# --------------------------------------------------------------------------- the FT protocol
def finetune(result_or_state: Any, method: str | None = None, epochs: int = 5, lr: float | None = None, *,
             protocol: str = "generic", train_head: bool | None = None, batch_size: int = 50,
             data: ImageData | None = None, partition: Partition | None = None, device: str = "cpu",
             fedetf_alternations: int = 20, progress: bool = False) -> PersonalResult:
    """Fine-tune the global model of a finished run on every client (spec §12.5) and evaluate it on
    each client's own test set before and after.

    ``result_or_state``: an ``fk.Result``, a finished run folder or a checkpoint dict. ``method``: the
    algorithm whose local loss and frozen parts the fine-tuning uses (default the run's own; it must
    build the same model). ``epochs`` × ⌈n_k/``batch_size``⌉ SGD steps per client (momentum 0.9, no
    weight decay, drawn by the kit's local rule: shuffled epochs, or random batches on Dirichlet),
    at ``lr`` (default: the run's last-round lr, as the protocol). Frozen parts: a fixed geometric
    head (ETF, orthonormal) stays frozen; a learned head, and FedBABU's random head, are fine-tuned
    (FedBABU-FT fine-tunes its head); ``train_head`` overrides. Fine-tuning with a teacher (FedDr+'s
    feature distillation) uses the global model as the teacher.

    ``protocol="fedetf"`` (a FedETF run only) is FedETF's own personalization (spec §9): one local
    update of ``epochs`` epochs of its balanced loss, then ``fedetf_alternations`` × {3 epochs of the
    ETF ``V`` only (lr 0.1, no momentum), 3 epochs of the projection only (lr 0.05, momentum 0.9, wd
    5e-4)}, both with plain CE; evaluated on the client's test set (not the original's 30 % split).

    ``data`` / ``partition``: reuse loaded ones (default: the run's, or loaded from its config).
    Returns a :class:`PersonalResult` (method ``"<algorithm>-FT"``).
    """
    if protocol not in PROTOCOLS:
        raise FeddrKitError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 0:
        raise FeddrKitError(f"epochs must be an integer >= 0, got {epochs!r}")
    if lr is not None and not (isinstance(lr, (int, float)) and lr > 0):
        raise FeddrKitError(f"lr must be a number > 0 or None (the run's last-round lr), got {lr!r}")
    cfg, state, algo_state, loaded = load_finished(result_or_state)
    if method is not None and (method not in ALGORITHMS or ALGORITHMS[method].personalized):
        raise FeddrKitError(f"method must be a global-model algorithm ({', '.join(a for a in ALGORITHMS if not ALGORITHMS[a].personalized)}) "
                            f"or None for the run's own, got {method!r}")
    if protocol == "fedetf" and cfg.algorithm != "fedetf":
        raise FeddrKitError(f"protocol='fedetf' fine-tunes a FedETF run, but this run's algorithm is {cfg.algorithm!r}")
    dev = torch.device(device)
    if loaded is not None:
        data, partition = data or loaded[0], partition if partition is not None else loaded[1]
    data = (data or fed.load_data(cfg)).to(dev)
    part = partition if partition is not None else fed.make_partition(cfg, data)
    fed.check_partition(part, data, cfg)

    run_algo, _ = _model_for(cfg, data, dev)
    if algo_state is not None:
        run_algo.load_state_dict(algo_state)
        state = run_algo.eval_state({k: v.to(dev) for k, v in state.items()})
    lr0 = cfg.lr if cfg.lr is not None else run_algo.initial_lr(cfg.model)
    ft_lr = float(lr) if lr is not None else fed.lr_at(cfg, lr0, cfg.rounds - 1)

    ft_cfg = cfg.replace(algorithm=method or cfg.algorithm, regularizer=None if method else cfg.regularizer,
                         batch_size=batch_size, momentum=0.9, weight_decay=0.0)
    if ft_cfg.regularizer is None:
        ft_cfg = ft_cfg.replace(regularizer=ALGORITHMS[ft_cfg.algorithm].default_regularizer)
    algo, model = _model_for(ft_cfg, data, dev)
    missing = set(model.state_dict()) ^ set(state)
    if missing:
        raise FeddrKitError(f"method: {ft_cfg.algorithm!r} builds a different model than the run's {cfg.algorithm!r} "
                            f"(parameters {', '.join(sorted(missing))}); use the run's own method")
    global_state = {k: v.to(dev) for k, v in state.items()}
    model.load_state_dict(global_state)
    head_trained = train_head if train_head is not None else algo.head not in ("etf", "orthonormal")
    for p in model.head.parameters():
        p.requires_grad_(bool(head_trained))
    teacher = None
    if algo.needs_teacher:
        teacher = fed.build_teacher(ft_cfg.model, data.num_classes, algo, dev)
        teacher.load_state_dict(global_state)

    evaluator = fed.Evaluator(data, part, cfg.seed)
    idx_all = _client_indices(part, dev)
    counts = torch.from_numpy(part.counts("train")).float().to(dev)
    rows = []
    for k in tqdm(range(part.num_clients), desc=f"{cfg.algorithm}-FT", disable=not progress):
        model.load_state_dict(global_state)
        before = evaluator.client_accuracy(model, algo, k)
        n = len(part.train_indices[k])
        steps = epochs * -(-n // batch_size)
        ctx = _context(ft_cfg, algo, part, k, counts, ft_lr, steps, FT_STREAM, global_state)
        if protocol == "fedetf":
            _fedetf_personalize(model, algo, data, idx_all[k], ctx, ft_cfg, dev, fedetf_alternations)
        elif steps > 0:
            fed.train_client(model, teacher, algo, data, idx_all[k], ctx, ft_cfg, dev)
        rows.append({"client": k, "n_train": n, "n_test": len(part.test_indices[k]), "before": before,
                     "after": evaluator.client_accuracy(model, algo, k)})
    info = {"algorithm": cfg.algorithm, "ft_method": ft_cfg.algorithm, "protocol": protocol, "epochs": epochs,
            "lr": ft_lr, "head_trained": bool(head_trained), "seed": cfg.seed}
    return PersonalResult(f"{cfg.algorithm}-FT", pd.DataFrame(rows), info)


def _fedetf_personalize(model: Net, algo: Algorithm, data: ImageData, idx: torch.Tensor, ctx: ClientContext,
                        cfg: Config, device: torch.device, alternations: int) -> None:
    """FedETF's personalization of one client (spec §9), in place on ``model`` (holding the global state)."""
    if ctx.num_steps > 0:
        fed.train_client(model, None, algo, data, idx, ctx, cfg, device)  # one normal local update
    per_epoch = -(-len(idx) // cfg.batch_size)
    gen = fed.client_generator(cfg.seed, FT_STREAM + 1, ctx.client, device)
    saved = {n: p.requires_grad for n, p in model.named_parameters()}
    phases = [(model.head.weight, 0.1, 0.0, 0.0), (model.body.projection.weight, 0.05, 0.9, 5e-4)]
    model.train()
    for _ in range(alternations):
        for param, lr, momentum, wd in phases:
            for p in model.parameters():
                p.requires_grad_(p is param)
            opt = torch.optim.SGD([param], lr=lr, momentum=momentum, weight_decay=wd)
            for batch in fed.local_batches(idx, cfg.replace(partition="iid"), 3 * per_epoch, gen):
                x = data.train_batch(batch, gen)
                loss = torch.nn.functional.cross_entropy(algo.logits(model, model.features(x)), data.train_y[batch])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    for n, p in model.named_parameters():
        p.requires_grad_(saved[n])


# --------------------------------------------------------------------------- local-only baselines
def local_only(cfg: Config, loss: str = "ce", *, epochs: float | None = None, lr: float | None = None,
               data: ImageData | None = None, partition: Partition | None = None, device: str = "cpu",
               progress: bool = False) -> PersonalResult:
    """Train every client alone from the common initialization of ``cfg.seed`` and evaluate it on its own test set.

    ``loss``: ``"ce"`` (cross-entropy, learned head), ``"ce_etf"`` (cross-entropy, the head initialized
    to the simplex ETF and then trained, bias zero) or ``"dr"`` (dot-regression against the frozen ETF).
    Budget: by default the local steps the client takes in expectation during ``cfg``'s federated run,
    ``rounds · clients_per_round / num_clients`` visits of :func:`federated.local_steps` each (at least
    one step); ``epochs`` instead gives ``epochs`` × one visit's steps. ``lr``: constant, default the
    loss's algorithm's default lr (``cfg.lr`` when set). Momentum and weight decay are ``cfg``'s.
    Returns a :class:`PersonalResult` (method ``"local-<loss>"``; ``before`` is NaN).
    """
    if loss not in LOCAL_LOSSES:
        raise FeddrKitError(f"loss must be one of {', '.join(LOCAL_LOSSES)}, got {loss!r}")
    if epochs is not None and not (isinstance(epochs, (int, float)) and epochs > 0):
        raise FeddrKitError(f"epochs must be a number > 0 or None (the federated run's expected budget), got {epochs!r}")
    dev = torch.device(device)
    lcfg = cfg.replace(algorithm=LOCAL_LOSSES[loss], regularizer="none")
    data = (data or fed.load_data(lcfg)).to(dev)
    part = partition if partition is not None else fed.make_partition(lcfg, data)
    fed.check_partition(part, data, lcfg)
    algo, model = _model_for(lcfg, data, dev)
    if loss == "ce_etf":
        with torch.no_grad():
            model.head.weight.copy_(heads.simplex_etf(model.num_classes, model.feature_dim, lcfg.seed))
            if model.head.bias is not None:
                model.head.bias.zero_()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    lr_used = float(lr) if lr is not None else (lcfg.lr if lcfg.lr is not None else algo.initial_lr(lcfg.model))
    visits = lcfg.rounds * lcfg.clients_per_round / lcfg.num_clients if epochs is None else epochs
    mean_size = len(data.train_y) // lcfg.num_clients
    evaluator = fed.Evaluator(data, part, lcfg.seed)
    idx_all = _client_indices(part, dev)
    counts = torch.from_numpy(part.counts("train")).float().to(dev)
    rows = []
    for k in tqdm(range(part.num_clients), desc=f"local-{loss}", disable=not progress):
        model.load_state_dict(init)
        n = len(part.train_indices[k])
        steps = max(1, round(visits * fed.local_steps(n, lcfg, mean_size)))
        ctx = _context(lcfg, algo, part, k, counts, lr_used, steps, LOCAL_STREAM, init)
        fed.train_client(model, None, algo, data, idx_all[k], ctx, lcfg, dev)
        rows.append({"client": k, "n_train": n, "n_test": len(part.test_indices[k]), "before": float("nan"),
                     "after": evaluator.client_accuracy(model, algo, k), "steps": steps})
    info = {"loss": loss, "lr": lr_used, "visits": visits, "seed": lcfg.seed}
    return PersonalResult(f"local-{loss}", pd.DataFrame(rows), info)
