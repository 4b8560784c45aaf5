"""TensorBoard logging of a run (``Config.tensorboard``): each evaluated round's history row as scalars
and the config as text, in ``out_dir/tb/``, through ``torch.utils.tensorboard``.

``tensorboard`` is an optional extra (``pip install tensorboard``, or ``pip install -e ".[tensorboard]"``):
the kit runs without it, and a run that asks for it without it is refused before anything loads.
Every run writes into its own folder, so ``tensorboard --logdir runs/sweep`` shows a sweep's runs side by side.
"""
from __future__ import annotations

import json
import math
import numbers
import shutil
from pathlib import Path
from typing import Any

from .errors import FeddrKitError

FOLDER = "tb"
MISSING = ("tensorboard=True needs the tensorboard package, which is not installed: "
           "pip install tensorboard (or pip install -e \".[tensorboard]\")")


def check_available() -> None:
    """Raise a one-line :class:`FeddrKitError` naming ``pip install tensorboard`` when it is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise FeddrKitError(MISSING) from None


def open_writer(out_dir: Path, config: dict[str, Any], fresh: bool) -> Any:
    """A ``SummaryWriter`` on ``out_dir/tb/`` that has the run's ``config`` written as text (tag ``config``).
    ``fresh`` (not a resume): event files already there, of the run this one replaces, are removed first."""
    check_available()
    from torch.utils.tensorboard import SummaryWriter

    if fresh:  # else TensorBoard would draw the replaced run's curves and this one's as one
        shutil.rmtree(Path(out_dir) / FOLDER, ignore_errors=True)

    writer = SummaryWriter(log_dir=str(Path(out_dir) / FOLDER))
    # Markdown: TensorBoard's text tab renders the indented block as code
    writer.add_text("config", "    " + json.dumps(config, indent=2).replace("\n", "\n    "))
    return writer


def log_row(writer: Any, row: dict[str, Any]) -> None:
    """Write a history row's finite numbers as scalars at step ``row["round"]`` (tags: the column names)."""
    step = int(row["round"])
    for name, value in row.items():
        if name != "round" and isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
            writer.add_scalar(name, float(value), global_step=step)
    writer.flush()
