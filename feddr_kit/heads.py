"""Fixed classifier heads: the simplex ETF of FedDr+, SphereFed's orthonormal head, FedBABU's random head (and bias).

The head functions return a ``[C, d]`` float32 tensor whose row ``c`` is the classifier vector of
class ``c`` (the layout of ``nn.Linear(d, C).weight``). They are built once, on the server,
from a seed, so every client receives the same head.
"""
from __future__ import annotations

import math

import torch

from .errors import FeddrKitError


def _check(num_classes: int, dim: int) -> None:
    if not isinstance(num_classes, int) or num_classes < 2:
        raise FeddrKitError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if not isinstance(dim, int) or dim < 1:
        raise FeddrKitError(f"dim must be a positive integer, got {dim!r}")


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def centering_basis(num_classes: int) -> torch.Tensor:
    """Orthonormal basis of the subspace orthogonal to the all-ones vector.

    Returns ``U``, float64 ``[C, C-1]`` with ``UᵀU = I`` and ``Uᵀ1 = 0`` (the Helmert basis), so
    ``U Uᵀ = I - 11ᵀ/C``.
    """
    C = num_classes
    U = torch.zeros(C, C - 1, dtype=torch.float64)
    for j in range(1, C):  # column j-1: (1, ..., 1, -j, 0, ...) / sqrt(j (j+1))
        U[:j, j - 1] = 1.0
        U[j, j - 1] = -float(j)
        U[:, j - 1] /= math.sqrt(j * (j + 1))
    return U


def simplex_etf(num_classes: int, dim: int, seed: int = 0) -> torch.Tensor:
    """A random simplex equiangular tight frame (eq. 3 of the paper), valid for any ``dim >= C-1``.

    ``V = sqrt(C/(C-1)) · U Qᵀ`` with ``U`` the centering basis ``[C, C-1]`` and ``Q`` ``[d, C-1]``
    orthonormal columns from the QR of a seeded Gaussian matrix. Rows have unit norm,
    pairwise inner products ``-1/(C-1)`` and sum to zero.

    Returns float32 ``[C, dim]``. Raises ``FeddrKitError`` when ``dim < C-1``, where no simplex ETF
    exists (its Gram matrix has rank ``C-1``).
    """
    _check(num_classes, dim)
    C = num_classes
    if dim < C - 1:
        raise FeddrKitError(
            f"dim must be >= num_classes - 1 = {C - 1} for a simplex ETF of {C} classes, got dim={dim}: "
            "the ETF's Gram matrix has rank C-1, so it cannot live in fewer dimensions "
            "(add a projection layer to at least C-1 dimensions instead)"
        )
    gaussian = torch.randn(dim, C - 1, generator=_generator(seed), dtype=torch.float64)
    Q, _ = torch.linalg.qr(gaussian)  # [d, C-1], QᵀQ = I
    V = math.sqrt(C / (C - 1)) * centering_basis(C) @ Q.T
    return V.to(torch.float32)


def orthonormal_head(num_classes: int, dim: int, seed: int = 0) -> torch.Tensor:
    """A random head with orthonormal rows (SphereFed's fixed head): ``W Wᵀ = I_C``.

    Returns float32 ``[C, dim]``; needs ``dim >= C``.
    """
    _check(num_classes, dim)
    if dim < num_classes:
        raise FeddrKitError(f"dim must be >= num_classes = {num_classes} for an orthonormal head, got dim={dim}")
    Q, _ = torch.linalg.qr(torch.randn(dim, num_classes, generator=_generator(seed), dtype=torch.float64))
    return Q.T.contiguous().to(torch.float32)


def random_head(num_classes: int, dim: int, seed: int = 0) -> torch.Tensor:
    """PyTorch's default ``nn.Linear(dim, C)`` weight init from a seed: U(-1/sqrt(d), 1/sqrt(d)).

    FedBABU freezes such a head at its random initialization. Returns float32 ``[C, dim]``.
    """
    _check(num_classes, dim)
    bound = 1.0 / math.sqrt(dim)
    return (torch.rand(num_classes, dim, generator=_generator(seed)) * 2 - 1) * bound


def random_head_bias(num_classes: int, dim: int, seed: int = 0) -> torch.Tensor:
    """The bias that ``nn.Linear(dim, C)`` draws right after :func:`random_head`'s weight, from the same seed.

    PyTorch's default bias init U(-1/sqrt(d), 1/sqrt(d)), continuing the weight's random stream, so
    ``(random_head, random_head_bias)`` is one seeded default-initialized linear layer. FedBABU keeps
    this bias frozen with its head. Returns float32 ``[C]``.
    """
    _check(num_classes, dim)
    gen = _generator(seed)
    torch.rand(num_classes, dim, generator=gen)  # the weight's draw (random_head), skipped
    bound = 1.0 / math.sqrt(dim)
    return (torch.rand(num_classes, generator=gen) * 2 - 1) * bound
