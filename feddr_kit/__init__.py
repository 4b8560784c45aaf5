"""feddr_kit: a teaching and analysis kit for FedDr+ (dot-regression + feature distillation FL).

    import feddr_kit as fk
    data = fk.data.load("cifar10")
    result = fk.run(fk.Config(algorithm="feddr+", rounds=30))
"""
import importlib

from . import errors, data, partition, heads, losses, models, methods, algorithms, engine, probes, instruments, sweep, personalize, paper, repo
from .config import Config
from .export import load_model
from .errors import FeddrKitError
from .federated import Result, beta_scaled_dr, run

# Imported on first use (fk.plots, fk.stats, ...): matplotlib, seaborn and scipy take seconds to
# load, which every command-line run and test subprocess would otherwise pay without using them.
_LAZY = ("plots", "teaching", "stats")


def __getattr__(name: str):
    if name in _LAZY:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["Config", "Result", "run", "load_model", "beta_scaled_dr", "FeddrKitError", "data", "partition", "heads", "losses", "models",
           "methods", "algorithms", "engine", "probes", "instruments", "plots", "teaching", "stats", "sweep", "personalize", "paper", "repo", "errors"]
__version__ = "0.1.0"
