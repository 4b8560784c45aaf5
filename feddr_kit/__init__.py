"""feddr_kit: a teaching and analysis kit for FedDr+ (dot-regression + feature distillation FL).

    import feddr_kit as fk
    data = fk.data.load("cifar10")
    result = fk.run(fk.Config(algorithm="feddr+", rounds=30))
"""
from . import errors, data, partition, heads, losses, models, algorithms, engine, probes, plots, teaching, stats, sweep, personalize
from .config import Config
from .errors import FeddrKitError
from .federated import Result, run

__all__ = ["Config", "Result", "run", "FeddrKitError", "data", "partition", "heads", "losses", "models",
           "algorithms", "engine", "probes", "plots", "teaching", "stats", "sweep", "personalize", "errors"]
__version__ = "0.1.0"
