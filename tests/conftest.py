"""Shared pytest setup: where the real data lives, and a session-wide CIFAR-10 fixture."""

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # so `pytest` works without `pip install -e .`
    sys.path.insert(0, str(REPO_ROOT))

# The workplace keeps the real CIFAR-10 in ../shared/data (an image folder); use it unless
# the caller says otherwise.
os.environ.setdefault("FEDDR_DATA_DIR", str((REPO_ROOT / "../shared/data").resolve()))


# Under pytest-xdist (pyproject's -n auto) the test processes share the cores, one each. A second torch thread
# per process only fights its neighbour for a core: on a 2-core machine one process on two threads beside a
# busy one ran 2.3 times slower than on one thread (benchmarks/drift_probe_timing.py's rows in
# results/drift_probe_timing.csv). The kernels nbval and papermill start inherit the setting.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"


def pytest_configure(config):
    """One torch thread in each test process when several share the machine (see above)."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        import torch

        torch.set_num_threads(1)


# The longest files first, so that two test processes finish together. With --dist loadfile each file (and each
# notebook) runs whole on one process, and xdist would otherwise hand out the files with the most tests first:
# README's command-1 test (one test, about 610 s in a fresh-clone run on 2 cores) then started last and ran
# alone for ten minutes. Any file of a minute or more started near the end leaves the other process idle for
# that long, so every such file is named. Seconds: each file's tests summed, from a fresh-clone run's
# --durations on 2 cores (the papermill slices of chapters 03, 04 and 08 as cut since); files not named keep
# their collection order after these.
LONGEST_FIRST = (
    "tests/test_readme_quickstart.py",    # 480 s: command 1, verbatim (chapter 00 under papermill)
    "tests/test_sweep.py",                # 340 s: killed and resumed sweeps
    "tests/test_notebooks.py",            # 300 s: chapters 03 and 04 and three results chapters under papermill
    "tests/test_sweep_hardening.py",      # 210 s
    "tests/test_reliability.py",          # 200 s
    "tests/test_engine.py",               # 190 s
    "tests/test_scorecard.py",            # 135 s: every chapter's claims cells
    "notebooks/07_sensitivity.ipynb",     # 135 s
    "tests/test_flower_deployment.py",    # 115 s
    "tests/test_drift_probe.py",          # 115 s
    "tests/test_chapter_paths.py",        # 90 s
    "tests/test_chapters_05_06.py",       # 85 s
    "tests/test_chapters_07_08.py",       # 80 s: chapter 08's live slice
    "notebooks/06_regularizer_synergy.ipynb",  # 75 s
    "notebooks/05_nine_algorithms.ipynb",  # 55 s
)


def pytest_collection_modifyitems(config, items):
    """Put the files of :data:`LONGEST_FIRST` first, in that order (a stable sort: each file's tests keep theirs).

    pyproject's ``--no-loadscope-reorder`` makes xdist hand the files out in this order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def cifar10_available() -> bool:
    """True when $FEDDR_DATA_DIR holds CIFAR-10 (torchvision files or the jpeg folder)."""
    root = Path(os.environ["FEDDR_DATA_DIR"])
    return (root / "cifar-10-batches-py").is_dir() or (root / "cifar10-jpeg").is_dir()


@pytest.fixture(scope="session")
def cifar10():
    """The real CIFAR-10 as ``feddr_kit.data.ImageData`` (skips when it is not on disk)."""
    if not cifar10_available():
        pytest.skip(f"real CIFAR-10 not found in FEDDR_DATA_DIR={os.environ['FEDDR_DATA_DIR']} "
                    "(needs cifar-10-batches-py/ or cifar10-jpeg/)")
    from feddr_kit import data

    return data.load("cifar10")


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny-model tests (``pytestmark = pytest.mark.usefixtures("one_thread")``).

    Their tensors are too small to split; a second OpenMP thread only adds synchronisation, and on a
    busy machine its spinning makes them many times slower. The previous setting is restored.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def synthetic():
    """The kit's default synthetic dataset (``fk.data.load("synthetic")``: 10 classes, 32x32, NOT real data)."""
    from feddr_kit import data

    return data.load("synthetic")
