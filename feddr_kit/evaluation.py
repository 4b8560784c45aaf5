"""Evaluation: forward passes over image sets, the global and per-client accuracies, the probe views.

A model without batch-statistics BatchNorm is evaluated in stored order (the order cannot change its
outputs). A batch-statistics model (mobilenet) sees every image set in a fixed seeded order
(:func:`feddr_kit.streams.eval_order`) in batches of ``EVAL_BATCH_SIZE``, so its predictions do not
depend on how a folder happens to store the images, and are the same in every round and on resume.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from . import probes as probes_mod
from .data import ImageData
from .models import EVAL_BATCH_SIZE, Net
from .partition import Partition
from .streams import EVAL_CLIENT_TEST_SET, EVAL_PROBES, EVAL_TEST_SET, eval_order

if TYPE_CHECKING:  # annotations only: the methods sit above this module
    from .methods.base import Algorithm


@torch.no_grad()
def forward_all(model: Net, algo: Algorithm, data: ImageData, x: torch.Tensor,
                order: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw features ``[N, d]`` and logits ``[N, C]`` of uint8 images ``x`` ``[N,3,H,W]``, in eval mode.

    Models whose BatchNorm uses batch statistics are fed fixed batches of ``EVAL_BATCH_SIZE`` (as the reference code),
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
    test set in one fixed permutation drawn from ``seed`` (:func:`feddr_kit.streams.eval_order`), the
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
        return eval_order(len(self.data.test_y), self.seed, EVAL_TEST_SET)

    def client_order(self, client: int) -> torch.Tensor:
        """Test indices of ``client`` in the order a batch-statistics model sees them: int64 ``[m_k]``."""
        idx = torch.from_numpy(np.asarray(self.test_indices[client], dtype=np.int64))
        return idx[eval_order(len(idx), self.seed, EVAL_CLIENT_TEST_SET, client)]

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
        """``{"test_acc", "local_test_acc", "feature_norm"}`` of ``model`` (in eval mode, logits by ``algo``)."""
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
        """:meth:`__call__` of a batch-statistics model: the test set in :meth:`global_order`, then each
        client's test set alone (:meth:`client_accuracy`), as a client would evaluate it."""
        y = self.data.test_y
        h, logits = forward_all(model, algo, self.data, self.data.test_x, self.global_order())
        local = [self.client_accuracy(model, algo, k) for k in range(self.num_clients)]
        return {"test_acc": float((logits.argmax(1) == y).float().mean()), "local_test_acc": float(np.mean(local)),
                "feature_norm": float(h.norm(dim=1).mean())}


def probe_set(data: ImageData, num_samples: int, seed: int, model: Net) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe images (uint8 ``[P,3,H,W]``) and labels ``[P]``: a class-balanced, seeded test subsample
    (:func:`feddr_kit.probes.probe_indices`), in a fixed seeded shuffle for a batch-statistics ``model``
    (so no probe batch holds a single class; see :func:`feddr_kit.streams.eval_order`)."""
    pidx = probes_mod.probe_indices(data.test_y, num_samples, seed).to(data.test_y.device)
    if model.batch_stat_norm:
        pidx = pidx[eval_order(len(pidx), seed, EVAL_PROBES).to(pidx.device)]
    return data.test_x[pidx], data.test_y[pidx]


def probe_view(model: Net, algo: Algorithm, data: ImageData, x: torch.Tensor, y: torch.Tensor) -> probes_mod.ModelView:
    """What the probes need of one model on the probe images ``x`` (uint8 ``[P,3,H,W]``), labels ``y`` ``[P]``:
    its features, logits and head (see :func:`feddr_kit.probes.view`)."""
    h, z = forward_all(model, algo, data, x)
    return probes_mod.view(h, z, model.head.weight.detach().float(), y)
