"""Small computations behind the teaching figures of notebooks 01-04.

Chapter 01 treats a feature ``h`` as a free 2-D vector in front of a fixed classifier ``V``
(``[C, 2]``, one row per class) and asks which way each loss pushes it: the cross-entropy force
split into its pulling and pushing parts (:func:`ce_forces`), the dot-regression force
(:func:`dr_force`), and where plain gradient descent on ``h`` takes it (:func:`descent_trajectory`).
Chapter 02 compares heads by their pairwise cosines (:func:`pairwise_cosines`,
:func:`head_cosine_table`). Chapters 03/04 summarize probe columns of run histories
(:func:`probe_table`) and can train one round of local models from one shared global model
(:func:`local_round_probes`). Every chapter's widget cell calls :func:`interact`: ipywidgets' own,
with a saved copy of the notebook saying how to get the controls back.

Everything returns plain tensors / DataFrames; the figures are in :mod:`feddr_kit.plots`.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from . import heads, losses, progress
from .errors import FeddrKitError


# --------------------------------------------------------------------------- chapter 01: 2-D forces
def circle_head(num_classes: int, rotation: float = 90.0) -> torch.Tensor:
    """``C`` unit class vectors evenly spaced on the circle, float64 ``[C, 2]``.

    Class ``c`` points at angle ``rotation + 360·c/C`` degrees. For ``C = 3`` this is a simplex
    ETF (pairwise cosines ``-1/2``); for ``C = 4`` it is a "cross" (cosines 0 and -1), which is
    not an ETF: a 4-class ETF needs 3 dimensions (chapter 02).
    """
    if not isinstance(num_classes, int) or num_classes < 2:
        raise FeddrKitError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    angles = torch.deg2rad(torch.tensor(rotation, dtype=torch.float64)
                           + 360.0 * torch.arange(num_classes, dtype=torch.float64) / num_classes)
    return torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)


def feature_grid(extent: float = 2.0, n: int = 11) -> torch.Tensor:
    """An ``n × n`` grid of 2-D feature points in ``[-extent, extent]²``, float64 ``[n·n, 2]``."""
    if n < 2 or extent <= 0:
        raise FeddrKitError(f"feature_grid needs n >= 2 and extent > 0, got n={n!r}, extent={extent!r}")
    ticks = torch.linspace(-extent, extent, n, dtype=torch.float64)
    gx, gy = torch.meshgrid(ticks, ticks, indexing="xy")
    return torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1)


def _labels(points: torch.Tensor, y: int) -> torch.Tensor:
    return torch.full((points.shape[0],), int(y), dtype=torch.long)


def ce_forces(points: torch.Tensor, V: torch.Tensor, y: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pulling and pushing *forces* of cross-entropy on features ``points`` ``[P, d]`` of class ``y``.

    A force is minus the gradient (the direction a descent step moves the feature), so with
    ``(pull, push) = fk.losses.pull_push(...)``: ``F_pull = -pull = (1 - p_y) v_y`` and
    ``F_push = -push = -Σ_{c≠y} p_c v_c``. Returns ``(F_pull, F_push)``, each ``[P, d]``.
    """
    pull, push = losses.pull_push(points, V, _labels(points, y))
    return -pull, -push


def dr_force(points: torch.Tensor, V: torch.Tensor, y: int) -> torch.Tensor:
    """Minus the gradient of the dot-regression loss ``½(cos(h, v_y) - 1)²`` at each feature, ``[P, d]``.

    Computed with autograd on :func:`feddr_kit.losses.dot_regression` (summed over points, so each
    row is that point's own gradient). It depends on ``v_y`` only: there is no pushing part.
    """
    h = points.detach().clone().requires_grad_(True)
    loss = losses.dot_regression(h, V.to(h.dtype), _labels(points, y)) * points.shape[0]
    (grad,) = torch.autograd.grad(loss, h)
    return -grad


def alignment_force_vs_norm(V: torch.Tensor, y: int = 0, offset_deg: float = 30.0,
                             norms=(0.5, 1, 2, 3, 4, 6, 8, 10)) -> pd.DataFrame:
    """How hard each loss still rotates a feature toward ``v_y`` once it is already roughly right.

    The feature sits ``offset_deg`` degrees away from ``v_y`` (rotated in the plane of the first two
    coordinates; ``V`` is ``[C, 2]``) at several norms. For each norm, the component of the
    force (minus the gradient) that turns the feature toward ``v_y`` — the part that changes the
    alignment — is computed for cross-entropy (``ce``) and dot-regression (``dr``), together
    with ``p_y``. Returns one row per norm: ``norm``, ``offset_deg``, ``p_true``, ``ce``, ``dr``.
    """
    V = V.to(torch.float64)
    if V.shape[1] != 2:
        raise FeddrKitError(f"V must be [C, 2], got {tuple(V.shape)}")
    a = math.atan2(float(V[y, 1]), float(V[y, 0])) + math.radians(offset_deg)
    u = torch.tensor([[math.cos(a), math.sin(a)]], dtype=torch.float64)
    tangent = torch.tensor([[math.sin(a), -math.cos(a)]], dtype=torch.float64)  # turns u toward v_y
    if float((tangent * V[y]).sum()) < 0:
        tangent = -tangent
    rows = []
    for r in norms:
        h = r * u
        F_pull, F_push = ce_forces(h, V, y)
        ce = float(((F_pull + F_push) * tangent).sum())
        dr = float((dr_force(h, V, y) * tangent).sum())
        p = torch.softmax(h @ V.T, dim=1)[0, y]
        rows.append({"norm": float(r), "offset_deg": float(offset_deg), "p_true": float(p), "ce": ce, "dr": dr})
    return pd.DataFrame(rows)


def descent_trajectory(h0, V: torch.Tensor, y: int, loss: str = "ce", lr: float = 0.5,
                       steps: int = 30) -> pd.DataFrame:
    """Plain gradient descent on a single feature ``h`` (the network is left out) under one loss.

    ``h0`` is the start ``[d]``; ``loss`` is ``"ce"`` (cross-entropy of logits ``V h``) or ``"dr"``
    (dot-regression). Returns one row per step ``0..steps`` with the feature's coordinates
    (``h0``, ``h1``, …), its norm, its cosine to the true class ``cos_true`` and its largest
    cosine to any other class ``cos_other_max``.
    """
    if loss not in ("ce", "dr"):
        raise FeddrKitError(f"loss must be 'ce' or 'dr', got {loss!r}")
    V = V.to(torch.float64)
    h = torch.as_tensor(h0, dtype=torch.float64).reshape(1, -1).clone()
    label = torch.tensor([int(y)])
    others = [c for c in range(V.shape[0]) if c != int(y)]
    rows = []
    for step in range(steps + 1):
        cos = F.cosine_similarity(h, V, dim=1)
        rows.append({"step": step, **{f"h{i}": float(h[0, i]) for i in range(h.shape[1])},
                     "norm": float(h.norm()), "cos_true": float(cos[int(y)]),
                     "cos_other_max": float(cos[others].max())})
        if step == steps:
            break
        h.requires_grad_(True)
        value = losses.cross_entropy(h @ V.T, label) if loss == "ce" else losses.dot_regression(h, V, label)
        (grad,) = torch.autograd.grad(value, h)
        h = (h - lr * grad).detach()
    df = pd.DataFrame(rows)
    df.insert(0, "loss", loss)
    return df


def alignment_race(V: torch.Tensor, y: int, starts: dict[str, float], norms=(1.0, 3.0, 10.0),
                   lrs=(0.1, 0.5, 2.0), steps: int = 30) -> pd.DataFrame:
    """Which loss aligns a free 2-D feature faster, from several starting points, norms and step sizes.

    ``starts`` maps a label to a starting angle in degrees (measured from the first axis); for each
    start, norm and lr, :func:`descent_trajectory` runs ``steps`` steps of CE and of DR from
    ``norm · (cos a, sin a)``. Returns one row per (start, norm, lr) with the final
    ``cos(h, v_y)`` of each loss (``ce``, ``dr``) and ``faster``: the loss that ends better aligned.
    """
    rows = []
    for label, angle in starts.items():
        a = math.radians(float(angle))
        u = torch.tensor([math.cos(a), math.sin(a)], dtype=torch.float64)
        for norm in norms:
            for lr in lrs:
                end = {loss: float(descent_trajectory(norm * u, V, y, loss, lr=lr, steps=steps)["cos_true"].iloc[-1])
                       for loss in ("ce", "dr")}
                rows.append({"start": label, "norm": float(norm), "lr": float(lr), **end,
                             "faster": "ce" if end["ce"] > end["dr"] else "dr"})
    return pd.DataFrame(rows)


def forces_at(angle_deg: float, norm: float, V: torch.Tensor, y: int = 0, lr: float = 0.5) -> dict:
    """Every force on one 2-D feature of class ``y``, and where one descent step of each loss takes it.

    The feature is ``h = norm · (cos a, sin a)`` with ``a = angle_deg`` (degrees, measured from the
    first axis), in front of the head ``V`` ``[C, 2]``. Returns a dict of float64 ``[2]`` tensors:
    ``h``; the cross-entropy forces ``ce_pull`` = ``(1 - p_y) v_y``, ``ce_push`` = ``-Σ_{c≠y} p_c v_c``
    and their sum ``ce``; the dot-regression force ``dr``; the features after one step of size
    ``lr``, ``h_ce`` = ``h + lr·ce`` and ``h_dr`` = ``h + lr·dr``; and the float ``p_y``.
    """
    if not norm > 0:
        raise FeddrKitError(f"norm must be > 0 (the dot-regression force is undefined at h = 0), got {norm!r}")
    V = torch.as_tensor(V, dtype=torch.float64)
    a = math.radians(float(angle_deg))
    h = float(norm) * torch.tensor([[math.cos(a), math.sin(a)]], dtype=torch.float64)
    pull, push = ce_forces(h, V, y)
    dr = dr_force(h, V, y)
    p_y = float(torch.softmax(h @ V.T, dim=1)[0, int(y)])
    ce = pull + push
    return {"h": h[0], "ce_pull": pull[0], "ce_push": push[0], "ce": ce[0], "dr": dr[0],
            "h_ce": (h + lr * ce)[0], "h_dr": (h + lr * dr)[0], "p_y": p_y}


# --------------------------------------------------------------------------- chapter 02: heads
def gram(head: torch.Tensor) -> torch.Tensor:
    """Gram matrix ``V Vᵀ`` ``[C, C]`` (float64) of a head ``[C, d]``."""
    V = head.to(torch.float64)
    return V @ V.T


def pairwise_cosines(head: torch.Tensor) -> np.ndarray:
    """Cosines between all pairs of distinct rows of ``head`` ``[C, d]``: ``C(C-1)/2`` values."""
    V = F.normalize(head.to(torch.float64), dim=1)
    G = V @ V.T
    i, j = torch.triu_indices(G.shape[0], G.shape[0], offset=1)
    return G[i, j].numpy()


HEAD_BUILDERS = {
    "simplex ETF": heads.simplex_etf,
    "random orthonormal": heads.orthonormal_head,
    "random init": heads.random_head,
}


def head_cosine_table(class_counts=(3, 5, 10, 20, 50, 100), dim: int = 128, seed: int = 0) -> pd.DataFrame:
    """Pairwise cosines of the three kinds of frozen heads for several class counts ``C``.

    One row per (head kind, ``C``, pair): columns ``head``, ``C``, ``cosine``. ``dim`` must be
    at least the largest ``C`` (the orthonormal head needs ``d >= C``).
    """
    rows = []
    for C in class_counts:
        for name, build in HEAD_BUILDERS.items():
            for value in pairwise_cosines(build(int(C), int(dim), seed)):
                rows.append({"head": name, "C": int(C), "cosine": float(value)})
    return pd.DataFrame(rows)


def etf_checks(V: torch.Tensor) -> dict[str, float]:
    """How far a head ``[C, d]`` is from a simplex ETF: largest errors of the three defining properties.

    ``norm_err``: max ``|‖v_c‖ - 1|``; ``angle_err``: max ``|cos(v_i, v_j) + 1/(C-1)|`` over
    ``i ≠ j``; ``mean_norm``: ``‖mean_c v_c‖``.
    """
    V = V.to(torch.float64)
    C = V.shape[0]
    cos = pairwise_cosines(V)
    return {
        "norm_err": float((V.norm(dim=1) - 1).abs().max()),
        "angle_err": float(np.abs(cos + 1.0 / (C - 1)).max()),
        "mean_norm": float(V.mean(dim=0).norm()),
    }


# --------------------------------------------------------------------------- chapters 03/04: probes
def with_gaps(history: pd.DataFrame) -> pd.DataFrame:
    """A copy of a probe history with ``align_gap_S`` / ``acc_gap_S`` = local minus ``global_*`` added,
    and, where ``global_feat_norm_S`` is recorded, ``feat_dist_rel_S`` = ``feat_dist_S / global_feat_norm_S``
    (how far the features moved, in units of the global model's feature length)."""
    h = history.copy()
    for s in ("obs", "unobs"):
        h[f"align_gap_{s}"] = h[f"align_{s}"] - h[f"global_align_{s}"]
        h[f"acc_gap_{s}"] = h[f"acc_{s}"] - h[f"global_acc_{s}"]
        if f"global_feat_norm_{s}" in h:
            h[f"feat_dist_rel_{s}"] = h[f"feat_dist_{s}"] / h[f"global_feat_norm_{s}"]
    return h


def seed_runs(cfg, runs: dict[str, str], seeds, data=None, reuse: dict | None = None):
    """Federated runs of several algorithms at several seeds, their histories stacked.

    ``cfg``: a :class:`feddr_kit.Config` (its ``algorithm`` and ``seed`` are replaced; the partition is
    drawn from each seed); ``runs``: label -> algorithm name; ``seeds``: the seeds. Returns
    ``(histories, results)``: one row per (run, seed, evaluated round) with columns ``run``,
    ``algorithm``, ``seed`` and the history's; and a dict ``(label, seed) -> Result`` (its ``model`` and
    ``partition`` feed :func:`same_model_study` / :func:`beta_sweep`). ``reuse``: results already run with
    this ``cfg``, keyed like the returned dict; they are taken instead of being run again.
    """
    from .federated import run

    frames, results = [], {}
    for seed in seeds:
        for label, name in runs.items():
            result = (reuse or {}).get((label, int(seed))) or run(cfg.replace(algorithm=name, seed=int(seed)), data=data)
            frames.append(result.history.assign(run=label, algorithm=name, seed=int(seed)))
            results[(label, int(seed))] = result
    histories = pd.concat(frames, ignore_index=True)
    front = ["run", "algorithm", "seed"]
    return histories[front + [c for c in histories.columns if c not in front]], results


def paired_claim(claim: str, source: str, setting: str, table: pd.DataFrame, column: str, a: str, b: str,
                 expected: str = "greater", margin: float = 0.0, by: str = "seed", percent: bool = False):
    """A :class:`feddr_kit.stats.Claim` on ``a - b`` in ``column`` of ``table``, paired over ``by``.

    ``table``: one row per (``run``, ``by``) (:func:`per_seed`'s output, or per-client rows with
    ``by="client"``); the interval comes from :func:`paired`. A column that is exactly 0 on both sides
    everywhere (e.g. an accuracy pinned at 0) is marked untestable. ``percent``: show the numbers in
    percentage points (the values are fractions). ``seeds`` of the claim: the values of ``by`` used.
    """
    from . import stats

    sides = table[table["run"].isin([a, b])]
    pinned = bool(len(sides)) and bool((sides[column] == 0).all())
    keys = sorted(sides[by].unique())
    label = f"{by}s {', '.join(str(k) for k in keys)}" if by == "seed" else f"{len(keys)} {by}s"
    return stats.Claim(claim, source, setting, paired(table, column, a, b, by=by), expected, margin, seeds=label,
                       testable=not pinned, scale=100.0 if percent else 1.0, unit=" pp" if percent else "",
                       fmt=".2f" if percent else ".3f")


def same_model_study(result, losses: dict[str, str], lrs=(None,), draws: int = 1, local_epochs: int = 2,
                     probe_samples: int = 500) -> pd.DataFrame:
    """Chapter 03's controlled experiment at one seed: from the final global model of ``result`` (a
    :class:`~feddr_kit.federated.Result`), one local round per loss, for ``draws`` client draws.

    ``losses``: label -> algorithm name (its local step, see :func:`local_round_probes`); ``lrs``: the
    learning rates to try, ``None`` for each algorithm's own, a number for one lr *shared* by every
    loss. Returns :func:`local_round_probes`'s rows with ``seed``, ``draw`` and ``lr`` (the shared
    value, NaN for each algorithm's own) added.
    """
    cfg = result.config
    frames = []
    for lr in lrs:
        shared = None if lr is None else {name: float(lr) for name in losses.values()}
        for k in range(draws):
            df = local_round_probes(result.model, result.data, result.partition, losses, round=cfg.rounds + k,
                                    clients_per_round=cfg.clients_per_round, local_epochs=local_epochs, lr=shared,
                                    probe_samples=probe_samples, seed=cfg.seed, model=cfg.model)
            frames.append(df.assign(seed=cfg.seed, draw=k, lr=math.nan if lr is None else float(lr)))
    return pd.concat(frames, ignore_index=True)


def beta_sweep(result, betas, local_epochs: int = 2, lr: float | None = None, probe_samples: int = 500,
               control: bool = False) -> pd.DataFrame:
    """Chapter 04's β sweep at one seed: from the final global model of ``result``, the round's clients
    train one local round with FedDr+'s loss at each β in ``betas`` (identical batches), probed.

    ``lr``: FedDr+'s lr (None: its default for the run's model). ``control``: also train, at every
    β > 0, the β-scaled DR control (:func:`feddr_kit.beta_scaled_dr`: plain DR at ``lr · β``, on the
    same batches), so that what FD adds is read against what the smaller DR step alone does. Returns
    :func:`local_round_probes`'s rows with ``seed``, ``beta`` and ``arm`` (``"FedDr+"`` or ``"DR lr×β"``)
    added; the run labels are ``beta=<β>`` and ``DR lr×<β>``.
    """
    from .methods.base import initial_lr

    cfg = result.config
    lr0 = float(lr) if lr is not None else initial_lr(cfg.replace(algorithm="feddr+", regularizer=None, lr=None))
    common = dict(round=cfg.rounds, clients_per_round=cfg.clients_per_round, local_epochs=local_epochs,
                  probe_samples=probe_samples, seed=cfg.seed, model=cfg.model)
    frames = []
    for b in betas:
        frames.append(local_round_probes(result.model, result.data, result.partition, {f"beta={b:g}": "feddr+"},
                                         beta=float(b), lr={"feddr+": lr0}, **common).assign(arm="FedDr+", beta=float(b)))
        if control and b > 0:
            frames.append(local_round_probes(result.model, result.data, result.partition, {f"DR lr×{b:g}": "dr"},
                                             lr={"dr": lr0 * float(b)}, **common).assign(arm="DR lr×β", beta=float(b)))
    return pd.concat(frames, ignore_index=True).assign(seed=cfg.seed)


def per_seed(histories: pd.DataFrame, skip_rounds: int = 0) -> pd.DataFrame:
    """Mean over evaluated rounds of every numeric column (gaps included), one row per (run, seed).

    ``histories``: stacked as :func:`seed_runs` returns them. Rounds ``<= skip_rounds`` are left out.
    Returns a DataFrame with columns ``run``, ``seed`` and the means.
    """
    h = with_gaps(histories)
    h = h[h["round"] > skip_rounds]
    if h.empty:
        raise FeddrKitError(f"no rounds left after skip_rounds={skip_rounds}")
    return h.groupby(["run", "seed"], sort=False).mean(numeric_only=True).reset_index()


def paired(table: pd.DataFrame, column: str, a: str, b: str, by: str = "seed", key: str = "run"):
    """Interval of ``a - b`` in ``column``, paired over ``by`` (seeds, or clients with ``by="client"``).

    ``table``: one row per (``key``, ``by``), e.g. :func:`per_seed`'s output or per-client probes;
    ``a`` / ``b``: two values of ``key``. Seeds give a paired t interval (:func:`feddr_kit.stats.difference`);
    clients a bootstrap interval of the per-client differences (:func:`feddr_kit.stats.bootstrap_interval`).
    Returns a :class:`feddr_kit.stats.Interval`.
    """
    from . import stats

    wide = table.pivot_table(index=by, columns=key, values=column, aggfunc="mean")
    for label in (a, b):
        if label not in wide:
            raise FeddrKitError(f"{key}={label!r} is not in the table; it has {list(wide.columns)}")
    pair = wide[[a, b]].dropna()
    if by == "client":
        return stats.bootstrap_interval((pair[a] - pair[b]).to_numpy())
    return stats.difference(pair[a].to_numpy(), pair[b].to_numpy(), paired=True)


def probe_table(histories: dict[str, pd.DataFrame], quantities=("align", "acc", "align_gap", "acc_gap"),
                skip_rounds: int = 0) -> pd.DataFrame:
    """Mean over rounds of probe quantities, observed vs unobserved, one row per run.

    ``histories`` maps a label (e.g. ``"CE (fedavg)"``) to a history with probe columns.
    Rounds ``<= skip_rounds`` are left out (the first rounds start from a random global model).
    Returns a DataFrame indexed by label with columns ``<quantity>_obs`` / ``<quantity>_unobs``.
    """
    rows = {}
    for label, hist in histories.items():
        h = with_gaps(hist)
        h = h[h["round"] > skip_rounds]
        if h.empty:
            raise FeddrKitError(f"{label}: no rounds left after skip_rounds={skip_rounds}")
        rows[label] = {f"{q}_{s}": float(h[f"{q}_{s}"].mean()) for q in quantities for s in ("obs", "unobs")}
    return pd.DataFrame.from_dict(rows, orient="index")


def claim(text: str, smaller: float, larger: float) -> dict:
    """One row of a chapter's table of paper claims: ``text`` holds when ``smaller < larger``.

    Both values are measured in the run (e.g. DR's and FedDr+'s mean feature distance). Returns
    ``{"claim", "should be smaller", "should be larger", "held"}``, the values rounded to 4 digits.
    """
    return {"claim": text, "should be smaller": round(float(smaller), 4), "should be larger": round(float(larger), 4),
            "held": bool(smaller < larger)}

def local_round_probes(global_model, data, partition, algorithms=("fedavg", "dr"), round: int = 0,
                       clients=None, clients_per_round: int = 10, local_epochs: int = 2, lr: dict | None = None,
                       beta: float = 0.9, probe_samples: int = 500, seed: int = 0, model: str | None = None
                       ) -> pd.DataFrame:
    """One round of local training from ONE shared global model, with several local losses, probed.

    This is the controlled version of chapter 03/04's comparison: every loss starts each client
    from exactly the same weights and sees exactly the same mini-batches and augmentations, so the
    loss is the only difference. ``global_model`` is a ``feddr_kit.models.Net`` (e.g. ``Result.model``
    of a ``dr`` run, whose head is the frozen simplex ETF); its head is kept as it is for every loss.

    ``algorithms``: algorithm names, or a dict ``label -> name``. Each contributes only its *local
    step*: its loss (``fedavg``/``fedbabu``: cross-entropy on ``head(h)``; ``dr``: dot-regression;
    ``feddr+``: ``β·DR + (1-β)·FD`` with the global model as teacher) and whether the head trains
    (only for ``fedavg``). ``lr`` maps a name to a learning rate (default: the algorithm's own for
    ``model``, the name of ``global_model``'s architecture; None: ``Config``'s default model). The clients are ``clients`` or the ``clients_per_round`` ones the kit's sampler draws for
    ``(seed, round)``. Returns one row per (loss, client): ``run``, ``algorithm``, ``client`` and the
    :data:`feddr_kit.probes.PROBE_COLUMNS` (local model vs the shared global model).
    """
    from . import probes as probes_mod
    from .streams import sample_clients

    runs = dict(algorithms) if isinstance(algorithms, dict) else {a: a for a in algorithms}
    if clients is None:
        clients = sample_clients(seed, round, partition.num_clients, clients_per_round)
    rows = [{"run": label, "algorithm": name, "client": k, **probes_mod.compare(local, glob, py, observed)}
            for label, name, k, local, glob, py, observed in _local_updates(
                global_model, data, partition, runs, clients=[int(c) for c in clients], round=round,
                local_epochs=local_epochs, lr=lr, beta=beta, probe_samples=probe_samples, seed=seed, model_name=model)]
    return pd.DataFrame(rows)


def _local_updates(global_model: torch.nn.Module, data, partition, runs: dict[str, str], *, clients: list[int],
                   round: int, local_epochs: int, lr: dict[str, float] | None, beta: float, probe_samples: int,
                   seed: int, model_name: str | None = None):
    """:func:`local_round_probes`'s training: every loss of ``runs`` (label -> algorithm name) trains each of
    ``clients`` for one round (their stream ``(seed, round, client)``) from ``global_model``'s weights.

    Yields ``(label, name, client, local_view, global_view, probe_y, observed)`` per (loss, client), the
    views being :class:`feddr_kit.probes.ModelView` on the probe set and ``observed`` the client's bool
    class mask ``[C]``.
    """
    import copy

    from .clients import Clients
    from .config import Config
    from .evaluation import probe_set, probe_view
    from .local import client_context, train_client
    from .methods import get_algorithm

    device = next(global_model.parameters()).device
    data = data.to(device)
    shared = Clients.of(data, partition, device)
    px, py = probe_set(data, probe_samples, seed, global_model)
    global_state = {k: v.detach().clone() for k, v in global_model.state_dict().items()}
    teacher = copy.deepcopy(global_model).eval().requires_grad_(False)
    for label, name in runs.items():
        cfg = Config(algorithm=name, local_epochs=local_epochs, seed=seed, beta=beta, progress=False,
                     lr=(lr or {}).get(name), partition=partition.kind, **({"model": model_name} if model_name else {}),
                     reference_partition=partition.params["file"] if partition.kind == "reference" else None)
        algo = get_algorithm(cfg)
        model = copy.deepcopy(global_model)
        algo.setup(model, seed)  # the algorithm's own state (e.g. SCAFFOLD's zero control variates) ...
        try:
            model.load_state_dict(global_state)  # ... but the shared global weights, head included
        except RuntimeError as err:
            raise FeddrKitError(f"{name} changes the architecture, so it cannot start from this global model") from err
        model.requires_grad_(True)  # the body always trains (a model from fk.load_model comes frozen) ...
        model.head.weight.requires_grad_(not algo.head_frozen)  # ... the head as the algorithm says
        if model.head.bias is not None:
            model.head.bias.requires_grad_(not algo.head_frozen)
        g_view = probe_view(teacher, algo, data, px, py)
        for k in clients:
            model.load_state_dict(global_state)
            ctx = client_context(algo, cfg, shared, k, round, algo.lr0, global_state)
            train_client(model, teacher, algo, data, shared.indices[k], ctx, cfg, device)
            yield label, name, k, probe_view(model, algo, data, px, py), g_view, py, shared.counts[k] > 0


def client_classes(global_model, data, partition, client: int, algorithms=("dr",), round: int = 0,
                   local_epochs: int = 2, lr: dict | None = None, probe_samples: int = 500, seed: int = 0) -> pd.DataFrame:
    """One client's local round from ``global_model``, class by class: the drill-down of chapter 03.

    Trains client ``client`` for one round with each loss in ``algorithms`` (names, or label -> name;
    ``lr`` as in :func:`local_round_probes`) and returns one row per (loss, class): ``run``, ``class``
    (index), ``observed`` (the class is in the client's training data), ``count`` (its training
    images), ``global_align`` / ``align`` (mean ``cos(f(x), v_y)`` of the class's probe images before /
    after the local round) and ``global_acc`` / ``acc`` (their accuracy).
    """
    if not isinstance(client, (int, np.integer)) or not 0 <= int(client) < partition.num_clients:
        raise FeddrKitError(f"client must be an integer in [0, {partition.num_clients}), got {client!r}")
    counts = partition.counts("train")[int(client)]
    rows = []
    runs = dict(algorithms) if isinstance(algorithms, dict) else {a: a for a in algorithms}
    for label, _, _, local, glob, py, _ in _local_updates(global_model, data, partition, runs, clients=[int(client)],
                                                          round=round, local_epochs=local_epochs, lr=lr, beta=0.9,
                                                          probe_samples=probe_samples, seed=seed):
        y = py.cpu().numpy()
        for c in np.unique(y):
            m = torch.from_numpy(y == c).to(py.device)
            rows.append({"run": label, "class": int(c), "observed": bool(counts[c] > 0), "count": int(counts[c]),
                         "global_align": float(glob.align[m].mean()), "align": float(local.align[m].mean()),
                         "global_acc": float((glob.pred[m] == py[m]).float().mean()),
                         "acc": float((local.pred[m] == py[m]).float().mean())})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- notebook outputs
# The units of the numbers a chapter's results.json holds, written into it (docs/outputs.md says the same).
RESULT_UNITS = {
    "accuracy": "fraction of test images classified right, in [0, 1] (0.41 = 41 %): every *_acc and acc_* value",
    "interval": "mean and 95 % t interval over seeds (or clients), in the unit of the value",
    "round": "communication round, counted from 1",
    "lr": "local SGD learning rate",
    "seconds": "wall-clock seconds",
    "loss": "mean cross-entropy-type loss per sample of the method's local objective",
    "align": "cosine similarity in [-1, 1]",
}


def save_results(out_dir, results: dict, config: dict | None = None, name: str = "results.json",
                 units: dict | None = None):
    """Write a chapter's key numbers (and the settings that produced them) to ``out_dir/results.json``.

    ``results``: the numbers (floats, ints, strings, nested dicts/lists; NumPy scalars are
    converted and NaN is written as null); ``config``: the notebook's parameters and/or run
    configs; ``units``: what the numbers' units are, added to :data:`RESULT_UNITS` (stored under
    ``"units"``). Written atomically. Returns the path.
    """
    from pathlib import Path

    from .rundir import write_json

    path = Path(out_dir) / name
    write_json(path, {"results": results, "config": config or {}, "units": {**RESULT_UNITS, **(units or {})}})
    return path


# --------------------------------------------------------------------------- widgets
# What a widget's cell shows where no kernel drew the widget: the committed notebooks (clean_outputs.py
# keeps only this text), GitHub, nbviewer, and any front end without the widgets extension, which falls
# back to an output's plain text (for ipywidgets, the widget's repr, frozen at the value it was saved
# with). A copy saved in JupyterLab after running the cell also keeps the widget's view, which
# JupyterLab 4 reports as "Error displaying widget: model not found" until the cell runs again; the
# note under each widget cell names both.
SAVED_WIDGET_NOTE = "Run this cell (Shift+Enter) to get the controls: a saved notebook keeps no live widgets."


class _Controls:
    """An ``ipywidgets.interactive`` displayed with :data:`SAVED_WIDGET_NOTE` as its plain-text fallback."""

    def __init__(self, widget):
        self.widget = widget

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = SAVED_WIDGET_NOTE
        return bundle

    def __repr__(self) -> str:  # outside IPython (a script running a chapter's cells), display() prints this
        return SAVED_WIDGET_NOTE


def interact(function, /, *, manual: bool = False, **controls) -> None:
    """``ipywidgets.interact(function, **controls)``: the controls and ``function``'s output, live.

    The one difference is what stays when the notebook is saved and reopened without running the cell:
    :data:`SAVED_WIDGET_NOTE` instead of the widget's repr (``interactive(children=(FloatSlider(…``).
    ``manual=True`` adds a button and calls ``function`` only when it is pressed (``interact_manual``).
    ``function`` draws or prints and returns nothing (a returned value is displayed at every move).
    Returns nothing: the cell needs no ``;``.

    In a kernel that a batch executor started (papermill, nbconvert, nbval: :func:`progress.batch_kernel`) it
    displays the note alone and calls nothing: no front end will draw the controls there, and ipywidgets'
    interact under papermill was seen to hang now and then after its output (the kernel idle, the executor
    waiting for the cell to end). Each chapter's next cell calls ``function`` with fixed values, so a batch
    run still executes it.
    """
    from IPython.display import display

    if progress.batch_kernel():
        display({"text/plain": SAVED_WIDGET_NOTE}, raw=True)
        return
    from ipywidgets import interactive

    options = dict(manual=manual, auto_display=True, manual_name="Run Interact")  # ipywidgets.interact's own
    display(_Controls(interactive(function, options, **controls)))
