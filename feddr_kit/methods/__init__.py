"""The federated methods, one module per family, registered in :data:`ALGORITHMS` on import.

* :mod:`~feddr_kit.methods.base`: :class:`Algorithm` (what a method declares and the hooks it may
  override) and the registry;
* :mod:`~feddr_kit.methods.global_fl`: FedAvg, FedBABU, dot-regression and FedDr+;
* :mod:`~feddr_kit.methods.baselines`: SCAFFOLD, FedNTD, FedExP, SphereFed and FedETF;
* :mod:`~feddr_kit.methods.personalized`: FedPer, FedRep, Per-FedAvg and Ditto.

The families are imported in that order, which is the registry's order (:func:`algorithm_names`).
"""
from .base import (ALGORITHMS, Algorithm, Batch, ClientContext, CrossEntropyOf, algorithm_names, get_algorithm,
                   initial_lr, register, resolve_regularizer)
from .global_fl import DotRegression, FedAvg, FedBABU, FedDrPlus
from .baselines import (FedETF, FedExP, FedNTD, Projected, Scaffold, SphereFed, effective_steps,
                        fedexp_reference_server_lr, fedexp_server_lr)
from .personalized import Ditto, FedPer, FedRep, PerFedAvg, PersonalizedAlgorithm

__all__ = ["ALGORITHMS", "Algorithm", "Batch", "ClientContext", "CrossEntropyOf", "algorithm_names", "get_algorithm",
           "initial_lr", "register", "resolve_regularizer", "FedAvg", "FedBABU", "DotRegression", "FedDrPlus",
           "Scaffold", "FedNTD", "FedExP", "SphereFed", "FedETF", "Projected", "effective_steps", "fedexp_server_lr",
           "fedexp_reference_server_lr", "FedPer", "FedRep", "PerFedAvg", "Ditto", "PersonalizedAlgorithm"]
