"""Closed-form checks of the heads and the losses."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from feddr_kit import heads, losses
from feddr_kit.errors import FeddrKitError


@pytest.mark.parametrize("C,d", [(2, 1), (3, 2), (4, 3), (10, 9), (10, 10), (10, 128), (100, 99), (100, 1024)])
def test_simplex_etf_is_unit_norm_equiangular_and_centered(C, d):
    V = heads.simplex_etf(C, d, seed=3).double()
    assert V.shape == (C, d)
    G = V @ V.T
    assert torch.allclose(G.diagonal(), torch.ones(C, dtype=torch.float64), atol=1e-6)
    off = G[~torch.eye(C, dtype=torch.bool)]
    assert torch.allclose(off, torch.full_like(off, -1.0 / (C - 1)), atol=1e-6)
    assert V.sum(0).abs().max() < 1e-5


def test_simplex_etf_is_seeded():
    assert torch.equal(heads.simplex_etf(10, 64, seed=1), heads.simplex_etf(10, 64, seed=1))
    assert not torch.equal(heads.simplex_etf(10, 64, seed=1), heads.simplex_etf(10, 64, seed=2))


@pytest.mark.parametrize("C,d", [(10, 8), (3, 1), (100, 50)])
def test_simplex_etf_below_c_minus_1_is_a_clear_error(C, d):
    with pytest.raises(FeddrKitError, match="dim must be >= num_classes - 1"):
        heads.simplex_etf(C, d)


def test_orthonormal_head_rows_are_orthonormal():
    W = heads.orthonormal_head(10, 128, seed=0).double()
    assert torch.allclose(W @ W.T, torch.eye(10, dtype=torch.float64), atol=1e-6)
    with pytest.raises(FeddrKitError, match="dim must be >= num_classes"):
        heads.orthonormal_head(10, 9)


def test_random_head_matches_linear_init_bounds():
    W = heads.random_head(10, 64, seed=0)
    assert W.abs().max() <= 1 / math.sqrt(64)
    assert torch.equal(W, heads.random_head(10, 64, seed=0))


def test_dot_regression_equals_closed_form():
    torch.manual_seed(0)
    h, V, y = torch.randn(7, 12), heads.simplex_etf(5, 12), torch.randint(0, 5, (7,))
    cos = [float(F.cosine_similarity(h[i], V[y[i]], dim=0)) for i in range(7)]
    expected = sum(0.5 * (c - 1) ** 2 for c in cos) / 7
    assert losses.dot_regression(h, V, y).item() == pytest.approx(expected, rel=1e-5)
    # perfectly aligned features (any positive scale) have zero loss
    assert losses.dot_regression(3.0 * V[y], V, y).item() == pytest.approx(0.0, abs=1e-10)


def test_feature_distillation_equals_closed_form():
    torch.manual_seed(0)
    h, g = torch.randn(6, 9), torch.randn(6, 9)
    expected = sum(float(((h[i] - g[i]) ** 2).sum()) for i in range(6)) / (6 * 9)
    assert losses.feature_distillation(h, g).item() == pytest.approx(expected, rel=1e-6)
    assert losses.feature_distillation(h, g).item() == pytest.approx(F.mse_loss(h, g).item(), rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 8), C=st.integers(2, 6), d=st.integers(1, 10), seed=st.integers(0, 10_000))
def test_pull_plus_push_equals_autograd(B, C, d, seed):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, d, generator=g, dtype=torch.float64, requires_grad=True)
    W = torch.randn(C, d, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (B,), generator=g)
    F.cross_entropy(h @ W.T, y, reduction="sum").backward()
    pull, push = losses.pull_push(h.detach(), W, y)
    assert torch.allclose(pull + push, h.grad, atol=1e-10)
    # the pull is a non-positive multiple of the own class vector: descent moves toward w_y
    coeff = (pull * W[y]).sum(1) / (W[y] * W[y]).sum(1)
    assert torch.allclose(pull, coeff[:, None] * W[y], atol=1e-10) and bool((coeff <= 0).all())


def test_dot_regression_gradient_has_no_push():
    # Autograd through losses.dot_regression on RAW features h: with ĥ = h/‖h‖ and cos = ⟨ĥ, v_y⟩,
    # ∂/∂h [½(cos - 1)²]/B = (cos - 1)/(B‖h‖) · (v_y - cos·ĥ). It lies in the plane of ĥ and the own
    # class vector v_y: no other class vector pushes, unlike cross-entropy's gradient.
    torch.manual_seed(1)
    V = heads.simplex_etf(4, 6).double()
    h = (3.0 * torch.randn(5, 6, dtype=torch.float64)).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 3, 1])
    losses.dot_regression(h, V, y).backward()
    hd = h.detach()
    norm = hd.norm(dim=1, keepdim=True)
    cos = ((hd / norm) * V[y]).sum(1, keepdim=True)
    expected = (cos - 1) / (len(y) * norm) * (V[y] - cos * hd / norm)
    assert torch.allclose(h.grad, expected, atol=1e-12)
    assert h.grad.abs().max() > 1e-3  # not trivially zero
