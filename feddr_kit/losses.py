"""Loss functions, as pure functions of tensors.

Shapes: ``B`` batch size, ``d`` feature dimension, ``C`` classes. Raw features ``h`` are the
penultimate activations ``f(x; θ)``; normalized features are ``ĥ = h / max(‖h‖, 1e-12)``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` ``[B, C]`` against labels ``y`` ``[B]``. Returns a scalar."""
    return F.cross_entropy(logits, y)


def cosine_to_class(features: torch.Tensor, V: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``cos(h_i, v_{y_i})`` for each sample: features ``[B, d]``, head ``V`` ``[C, d]``, labels ``[B]`` → ``[B]``."""
    return F.cosine_similarity(features, V[y], dim=1, eps=1e-12)


def dot_regression(features: torch.Tensor, V: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Dot-regression loss of FedDr+: ``mean_i ½ (⟨ĥ_i, v_{y_i}⟩ - 1)²``.

    ``features`` are raw ``[B, d]`` (normalized here); ``V`` ``[C, d]`` has unit-norm rows (the
    ETF), so the inner product is the cosine. Its gradient only pulls ``ĥ`` toward ``v_y``; there
    is no push away from other classes. Returns a scalar.
    """
    cos = (F.normalize(features, dim=1, eps=1e-12) * V[y]).sum(dim=1)
    return 0.5 * (cos - 1.0).pow(2).mean()


def feature_distillation(features: torch.Tensor, teacher_features: torch.Tensor) -> torch.Tensor:
    """Feature distillation of FedDr+: mean over batch AND dimensions of ``(h - h_g)²`` on raw features.

    ``features`` and ``teacher_features`` are ``[B, d]``; equals ``nn.MSELoss()(h, h_g)``. Returns a scalar.
    """
    return (features - teacher_features).pow(2).mean()


def pull_push(features: torch.Tensor, W: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the gradient of the summed cross-entropy w.r.t. the features into pulling and pushing parts.

    With logits ``z_i = W h_i`` and ``p_i = softmax(z_i)`` (paper, appendix B):
    ``∂L/∂h_i = -(1 - p_{i,y}) w_y + Σ_{c≠y} p_{i,c} w_c``. The first term (``pull``) is the part
    whose descent step moves ``h_i`` toward its own class vector; the second (``push``) moves it away
    from the other classes' vectors, weighted by how much probability they take.

    Takes features ``[B, d]``, ``W`` ``[C, d]``, labels ``[B]``; returns ``(pull, push)``, each
    ``[B, d]``, with ``pull + push`` equal to autograd's gradient of ``sum_i CE(W h_i, y_i)``.
    """
    p = torch.softmax(features @ W.T, dim=1)  # [B, C]
    p_true = p.gather(1, y[:, None])  # [B, 1]
    pull = -(1.0 - p_true) * W[y]
    p_others = p.scatter(1, y[:, None], 0.0)
    push = p_others @ W
    return pull, push


def prox(params: list[torch.Tensor], global_params: list[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx term ``(μ/2) Σ ‖θ - θ_g‖²`` over matching lists of parameter tensors. Returns a scalar."""
    return 0.5 * mu * sum((p - g).pow(2).sum() for p, g in zip(params, global_params))


def kd(logits: torch.Tensor, teacher_logits: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """Hinton distillation ``τ² · KL(softmax(z_g/τ) ‖ softmax(z/τ))``, averaged over the batch.

    ``logits`` and ``teacher_logits`` are ``[B, C]``; equals ``τ² · KLDivLoss(reduction='batchmean')``.
    """
    log_p = F.log_softmax(logits / tau, dim=1)
    q = F.softmax(teacher_logits / tau, dim=1)
    # F.kl_div's pointwise terms, written out: kl_div has no torch.func batching rule.
    return tau**2 * (torch.xlogy(q, q) - q * log_p).sum() / logits.shape[0]


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Drop each sample's true-class logit: ``[B, C]`` → ``[B, C-1]``, other classes in their order."""
    # A gather, not a boolean mask, so the shape is static (torch.func.vmap in the batched engine).
    C = logits.shape[1]
    others = torch.arange(C - 1, device=logits.device)
    return logits.gather(1, others + (others >= y[:, None]))


def ntd(logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """FedNTD's not-true distillation: :func:`kd` on the logits with the true class removed."""
    return kd(not_true_logits(logits, y), not_true_logits(teacher_logits, y), tau)


def logit_distillation(logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Logit matching ``mean over batch and classes of (z - z_g)²`` (``nn.MSELoss()``). Returns a scalar."""
    return (logits - teacher_logits).pow(2).mean()


def mse_to_onehot(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """SphereFed's loss ``nn.MSELoss()(z, onehot(y))`` = ``(1/(B·C)) Σ_i ‖z_i - e_{y_i}‖²``.

    ``logits`` ``[B, C]``, labels ``y`` ``[B]``. Returns a scalar.
    """
    return (logits - F.one_hot(y, logits.shape[1]).to(logits.dtype)).pow(2).mean()


def balanced_softmax(logits: torch.Tensor, y: torch.Tensor, class_counts: torch.Tensor) -> torch.Tensor:
    """FedETF's balanced softmax ``CE(z + log n, y)`` with the client's label counts ``n``.

    ``logits`` ``[B, C]``, labels ``y`` ``[B]``, ``class_counts`` ``[C]``. Counts of 0 are replaced by 1
    (FedETF's own code), so an absent class keeps its plain logit. Returns a scalar.
    """
    log_prior = class_counts.to(logits.dtype).clamp(min=1.0).log()
    return F.cross_entropy(logits + log_prior, y)
