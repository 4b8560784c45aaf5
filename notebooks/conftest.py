"""pytest setup for `pytest --nbval-lax notebooks/`: the kernels nbval starts inherit this
process's environment, so point them at the workplace's real CIFAR-10 (as tests/conftest.py does)
unless FEDDR_DATA_DIR is already set."""

import os
from pathlib import Path

_SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
if _SHARED.is_dir():
    os.environ.setdefault("FEDDR_DATA_DIR", str(_SHARED.resolve()))


import pytest  # noqa: E402

README_COMMAND_1 = "tests/test_readme_quickstart.py::test_command_1_runs_verbatim_from_the_root_of_a_fresh_copy"


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    """Run chapter 00 once per session. README's command 1 test executes it top to bottom under papermill
    (its live runs take minutes) and fails on any error or failed assert, as nbval does; when that test is
    in the session and not skipped, chapter 00's nbval cells are skipped with a reason saying so. Alone
    (``pytest notebooks/``, ``-m "not slow"``, or without CIFAR-10) nbval runs chapter 00 as every chapter."""
    readme = [item for item in items if item.nodeid.endswith(README_COMMAND_1)]
    if not readme or any(mark.args and mark.args[0] for mark in readme[0].iter_markers("skipif")):
        return
    skip = pytest.mark.skip(reason=f"chapter 00 runs in this session under papermill, from README's command 1 ({README_COMMAND_1})")
    for item in items:
        if item.nodeid.startswith("notebooks/00_quickstart.ipynb"):
            item.add_marker(skip)
