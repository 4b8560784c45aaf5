"""pytest setup for `pytest --nbval-lax notebooks/`: the kernels nbval starts inherit this
process's environment, so point them at the workplace's real CIFAR-10 (as tests/conftest.py does)
unless FEDDR_DATA_DIR is already set."""

import os
from pathlib import Path

_SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
if _SHARED.is_dir():
    os.environ.setdefault("FEDDR_DATA_DIR", str(_SHARED.resolve()))
