"""How strong a regularizer's pull is next to the method's own loss, measured during local training.

FedDr+'s local loss is ``β·L_DR + (1-β)·L_FD``. Whether the distillation term does anything depends
on how large its gradient is next to the dot-regression term's, and that depends on the model's
feature scale: ``∂L_DR/∂h`` shrinks as ``1/‖h‖`` while ``∂L_FD/∂h = 2(h - h_g)/(B·d)`` grows with
the features' drift. With features of norm ~1 and ``d = 128`` the FD term can be thousands of times
weaker, and FedDr+ is then DR with its step multiplied by β.

For any loss ``task + reg`` (``task = β·L_alg``, ``reg = (1-β)·L_reg``) a local step can record

* ``‖∂reg/∂h‖ / ‖∂task/∂h‖``: the ratio with respect to the batch's raw features ``h`` ``[B, d]``
  (Frobenius norms over the batch), :func:`feature_gradient_norms`;
* ``‖∂reg/∂θ‖ / ‖∂task/∂θ‖``: the same with respect to the body's trainable parameters ``θ``
  (all of them together), :func:`split_norms`.

A :class:`GradientRatios` sums them over one client's measured steps; :func:`round_ratios` turns a
round's clients into the history columns ``grad_ratio_features`` and ``grad_ratio_body`` (the mean
over every measured step of every client). The update itself is untouched: the measurement takes
extra gradients of the same graph, it never replaces the step's own backward pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

COLUMNS = ("grad_ratio_features", "grad_ratio_body")


def feature_gradient_norms(terms_of: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                           h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖∂task/∂h‖, ‖∂reg/∂h‖)`` at features ``h`` ``[B, d]``, two scalar tensors.

    ``terms_of(h)`` recomputes ``(task, reg)`` (two scalars) from features ``h`` alone, everything else
    held fixed. Written with :mod:`torch.func`, so it runs eagerly and under ``torch.func.vmap`` (the
    batched engine) alike. A term that does not depend on ``h`` (FedProx's) has a zero gradient.
    """
    _, pullback = torch.func.vjp(terms_of, h.detach())
    one, zero = torch.ones((), dtype=h.dtype, device=h.device), torch.zeros((), dtype=h.dtype, device=h.device)
    (g_task,) = pullback((one, zero))
    (g_reg,) = pullback((zero, one))
    return g_task.norm(), g_reg.norm()


def split_norms(total_grads: Sequence[torch.Tensor | None], reg_grads: Sequence[torch.Tensor | None],
                stacked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖∂task/∂θ‖, ‖∂reg/∂θ‖)`` over a list of parameters taken together.

    ``total_grads`` are the gradients of ``task + reg`` (the step's own backward pass) and ``reg_grads``
    those of ``reg`` alone (one more pass, ``torch.autograd.grad(reg, params, retain_graph=True)``), each a
    list matching the parameters, ``None`` meaning zero. ``∂task/∂θ`` is their difference, so the
    measurement costs one backward pass, not two. With ``stacked=True`` every tensor is ``[m, *shape]``
    (one row per client, the batched engine) and the two norms are ``[m]``; else they are scalars.
    """
    def sq(g: torch.Tensor) -> torch.Tensor:
        g = g.float().pow(2)
        return g.flatten(1).sum(1) if stacked else g.sum()

    task_sq = reg_sq = 0.0
    for total, reg in zip(total_grads, reg_grads):
        if total is None and reg is None:
            continue
        if reg is None:
            task_sq = task_sq + sq(total)
            continue
        reg_sq = reg_sq + sq(reg)
        task_sq = task_sq + sq(-reg if total is None else total - reg)
    return torch.as_tensor(task_sq).sqrt(), torch.as_tensor(reg_sq).sqrt()


@dataclass
class GradientRatios:
    """One client's sums over its measured local steps: ``features`` and ``body`` (float64 scalars) add up
    the per-step ratios ``‖∇reg‖ / ‖∇task‖``, ``steps`` counts the steps. A step whose task gradient is 0
    adds ``inf`` (or ``nan`` when both are 0): the ratio is then undefined, and so is the mean."""

    features: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))
    body: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))
    steps: int = 0

    def add(self, feature_norms: tuple[torch.Tensor, torch.Tensor], body_norms: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Add one step: ``(‖∂task‖, ‖∂reg‖)`` w.r.t. the features and w.r.t. the body (scalar tensors)."""
        self.add_sums(feature_norms[1] / feature_norms[0], body_norms[1] / body_norms[0], 1)

    def add_sums(self, features: torch.Tensor, body: torch.Tensor, steps: int) -> None:
        """Add the sums of ``steps`` steps at once (the batched engine's per-client totals)."""
        self.features = self.features.to(features.device) + features.detach().double()
        self.body = self.body.to(body.device) + body.detach().double()
        self.steps += int(steps)

    def as_floats(self) -> dict[str, float]:
        """``{"features": sum, "body": sum, "steps": count}`` as Python floats (what crosses Flower's wire)."""
        return {"features": float(self.features), "body": float(self.body), "steps": float(self.steps)}

    @classmethod
    def from_floats(cls, sums: dict[str, float]) -> "GradientRatios":
        """The inverse of :meth:`as_floats`."""
        return cls(torch.tensor(sums["features"], dtype=torch.float64), torch.tensor(sums["body"], dtype=torch.float64),
                   int(sums["steps"]))


def round_ratios(logs: Sequence[GradientRatios | None]) -> dict[str, float]:
    """The history columns of a round from its clients' logs (in the round plan's order): the mean ratio
    over every measured step, ``{"grad_ratio_features": …, "grad_ratio_body": …}``; ``{}`` when nothing
    was measured (no regularizer, or a round that is not evaluated)."""
    measured = [g.as_floats() for g in logs if g is not None and g.steps]
    if not measured:
        return {}
    steps = sum(m["steps"] for m in measured)
    return {"grad_ratio_features": sum(m["features"] for m in measured) / steps,
            "grad_ratio_body": sum(m["body"] for m in measured) / steps}
