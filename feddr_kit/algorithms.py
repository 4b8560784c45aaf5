"""The methods under the name the kit gave them first: ``fk.algorithms`` re-exports :mod:`feddr_kit.methods`.

Notebooks, tests and scripts import ``feddr_kit.algorithms`` (``get_algorithm``, ``algorithm_names``,
``ClientContext``, the method classes, ...); the code lives in :mod:`feddr_kit.methods`, one module per family.
"""
from .methods import *  # noqa: F401,F403
from .methods import __all__  # noqa: F401
from .methods.base import HEAD_KINDS  # noqa: F401
from .methods.global_fl import _CE_LR  # noqa: F401
