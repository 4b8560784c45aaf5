"""Every seeded random stream of a run, each a pure function of the seed and its own coordinates.

A run never draws from a shared, stateful generator. Which clients a round samples, the batches and
augmentations of one client's local training, and the order in which a batch-statistics model sees
evaluation images are each computed from ``(seed, coordinates)`` alone. So every algorithm sees the
same clients and the same batches under one seed, and a resumed run replays exactly what an
uninterrupted one would have done.

A client's local training draws from :func:`client_generator` at ``(seed, round, client)``. Work
that is not a training round (an evaluation-time adaptation, fine-tuning, local-only training) uses
the same function with a "round" far beyond any real one, named below, so its stream never
coincides with a round's.
"""
from __future__ import annotations

import numpy as np
import torch

# "Rounds" of client_generator streams that are not training rounds.
PERSONALIZED_EVAL_ROUND = 1_000_003  # + the round: Per-FedAvg's adaptation step before its evaluation
FINETUNE_ROUND = 2_000_003  # fine-tuning a finished run (feddr_kit.personalize.finetune)
LOCAL_ONLY_ROUND = 2_000_004  # local-only training (feddr_kit.personalize.local_only)
FEDETF_PHASES_ROUND = FINETUNE_ROUND + 1  # FedETF's own personalization phases, after its local update

# Sub-streams of eval_order: what is being evaluated in a fixed order.
EVAL_TEST_SET = 0  # the global test set
EVAL_CLIENT_TEST_SET = 1  # one client's local test set (followed by the client id)
EVAL_PROBES = 2  # the probe images
EVAL_CALIBRATION = 3  # one client's training images, for SphereFed's head calibration (followed by the client id)
_EVAL_STREAM = 4242  # keeps the evaluation order's random stream apart from every other use of the seed


def sample_clients(seed: int, round: int, num_clients: int, per_round: int) -> np.ndarray:
    """The clients of round ``round``: ``per_round`` distinct ids (int64 ``[per_round]``), a pure function of ``(seed, round)``."""
    return np.random.default_rng([seed, round, 1]).choice(num_clients, per_round, replace=False)


def client_generator(seed: int, round: int, client: int, device: torch.device) -> torch.Generator:
    """The generator of one client's local training in one round (batch order and augmentation), on ``device``."""
    s = int(np.random.SeedSequence([seed, round, client]).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator(device=device).manual_seed(s)


def eval_order(n: int, seed: int, *stream: int) -> torch.Tensor:
    """The order in which a batch-statistics model sees ``n`` evaluation samples: int64 ``[n]``.

    A permutation of ``range(n)``, a pure function of ``(seed, *stream)`` (``stream``: one of the
    ``EVAL_*`` sub-streams above, and a client id where it says so): the same in every round, for
    every algorithm and after a resume. With BatchNorm on batch statistics a batch's predictions
    depend on its class mix, and data stored by class (an image folder) would otherwise give
    one-class batches whose statistics leak the label; a fixed shuffle gives each batch the class
    mix of the whole set, as torchvision's interleaved CIFAR order does for the reference code.
    """
    rng = np.random.default_rng([int(seed), _EVAL_STREAM, *(int(s) for s in stream)])
    return torch.from_numpy(rng.permutation(n).astype(np.int64))
