"""The paper's analysis quantities (figures 2-4), measured on a fixed probe set of test images.

For each sampled client, after local training, on the probe images of its observed classes
(``obs``: present in its training split) and of the rest (``unobs``):

* ``align_S``: mean ``cos(f(x; θ_local), v_y)`` against the local model's own head row ``v_y``;
* ``acc_S``: accuracy of the local model;
* ``global_align_S`` / ``global_acc_S``: the same for the global model the client started from;
* ``feat_dist_S``: mean ``‖f_local(x) - f_global(x)‖₂``;
* ``feat_angle_S``: mean angle between ``f_local(x)`` and ``f_global(x)``, in degrees;
* ``feat_norm_diff_S``: mean ``‖f_local(x)‖ - ‖f_global(x)‖``;
* ``global_feat_norm_S``: mean ``‖f_global(x)‖``, the scale the three feature quantities above are read
  against (``feat_dist_S / global_feat_norm_S`` is the distance relative to the global feature's length).

The probe set is a class-balanced subsample of the official test set, drawn once from the seed.

Besides the probe images, the drift of the weights themselves: ``weight_change``, the relative change
``‖θ_local - θ_global‖ / ‖θ_global‖`` of the feature extractor's parameters in one client's local
training (:func:`relative_change`). The head is left out, so that a method with a frozen head and one
that trains it are compared on the same parameters.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

PROBE_COLUMNS = [
    f"{q}_{s}"
    for q in ("align", "acc", "global_align", "global_acc", "feat_dist", "feat_angle", "feat_norm_diff",
              "global_feat_norm")
    for s in ("obs", "unobs")
]


def probe_indices(test_y: torch.Tensor, num_samples: int, seed: int) -> torch.Tensor:
    """A class-balanced, seeded subsample of ``num_samples`` test indices (int64 ``[≤ num_samples]``)."""
    y = test_y.cpu().numpy()
    classes = np.unique(y)
    per_class = max(1, num_samples // len(classes))
    rng = np.random.default_rng([seed, 7])
    picked = [rng.permutation(np.flatnonzero(y == c))[:per_class] for c in classes]
    return torch.from_numpy(np.sort(np.concatenate(picked)))


@dataclass
class ModelView:
    """Features ``h`` ``[P, d]``, predictions ``[P]`` and alignment ``cos(h, v_y)`` ``[P]`` of one model on the probe set."""

    h: torch.Tensor
    pred: torch.Tensor
    align: torch.Tensor


def view(h: torch.Tensor, logits: torch.Tensor, head: torch.Tensor, y: torch.Tensor) -> ModelView:
    """Bundle a model's probe-set outputs; ``head`` is its own ``[C, d]`` classifier."""
    return ModelView(h=h, pred=logits.argmax(1), align=F.cosine_similarity(h, head[y], dim=1, eps=1e-12))


def compare(local: ModelView, glob: ModelView, y: torch.Tensor, observed: torch.Tensor) -> dict[str, float]:
    """All probe quantities for one client; ``observed`` is a bool mask ``[C]`` of its training classes.

    Returns a dict keyed by :data:`PROBE_COLUMNS`; a class set with no probe image gives NaN.
    """
    correct_l = (local.pred == y).float()
    correct_g = (glob.pred == y).float()
    dist = (local.h - glob.h).norm(dim=1)
    cos = F.cosine_similarity(local.h, glob.h, dim=1, eps=1e-12).clamp(-1.0, 1.0)
    angle = torch.rad2deg(torch.arccos(cos))
    norm_diff = local.h.norm(dim=1) - glob.h.norm(dim=1)
    per_sample = {
        "align": local.align, "acc": correct_l, "global_align": glob.align, "global_acc": correct_g,
        "feat_dist": dist, "feat_angle": angle, "feat_norm_diff": norm_diff, "global_feat_norm": glob.h.norm(dim=1),
    }
    in_obs = observed[y]
    out: dict[str, float] = {}
    for q, values in per_sample.items():
        for s, mask in (("obs", in_obs), ("unobs", ~in_obs)):
            out[f"{q}_{s}"] = float(values[mask].mean()) if bool(mask.any()) else float("nan")
    return out


def relative_change(local: list[torch.Tensor], glob: list[torch.Tensor]) -> float:
    """``‖local - glob‖ / ‖glob‖`` over lists of matching tensors taken together as one vector (float64 sums).

    ``local`` and ``glob`` are the same parameters after and before a client's local training (the
    feature extractor's, in one order). A zero ``glob`` gives ``inf`` (or ``nan`` when nothing moved).
    """
    diff = sum(float((a.detach().double() - b.detach().double()).pow(2).sum()) for a, b in zip(local, glob))
    base = sum(float(b.detach().double().pow(2).sum()) for b in glob)
    return float(np.sqrt(diff) / np.sqrt(base)) if base > 0 else (float("nan") if diff == 0 else float("inf"))
