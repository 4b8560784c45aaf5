"""README's command 1, as a new user runs it: from the root of a fresh copy of the repository.

The command is read from README.md itself, so the README and this test cannot drift apart. Its
install part (`python3 -m venv .venv && .venv/bin/pip install -q -r requirements.txt`) is the one
step left out: it needs the network and minutes, and it only makes the environment these tests
already run in. That environment stands in as the copy's `.venv` (a link), so the rest of the
command, papermill included, runs verbatim.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from chapter_cells import cifar10_available
from test_hardening_round4 import end_tree, guard

REPO = Path(__file__).resolve().parents[1]
INSTALL = ("python3 -m venv .venv", ".venv/bin/pip install -q -r requirements.txt")


def readme_command_1() -> str:
    """The line under `# 1.` in the first bash block of README's "Two commands" section."""
    section = (REPO / "README.md").read_text().split("\n## Two commands\n", 1)[1]
    lines = section.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("# 1.")) + 1]


def after_install(command: str) -> str:
    """What the command does once the environment is installed: every step after the install's two."""
    steps = command.split(" && ")
    assert tuple(steps[:2]) == INSTALL, f"README's command 1 no longer starts by installing: {command}"
    return " && ".join(steps[2:])


def test_command_1_is_install_then_papermill_of_the_quickstart():
    part = after_install(readme_command_1())
    assert ".venv/bin/papermill" in part and "notebooks/00_quickstart.ipynb runs/00_quickstart.ipynb" in part
    assert "-p out_dir runs/quickstart" in part and "cd " not in part  # run from the repository root


def fresh_copy(dest: Path) -> Path:
    """The working tree's tracked and new files (what a clone of it holds: no .venv, runs/ or data/) under ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, so its files cannot be listed: {listed.stderr.decode().strip()}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / name
        if src.is_file():  # a file deleted but not yet staged is still listed
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.mark.slow
@pytest.mark.skipif(not cifar10_available(), reason="real CIFAR-10 not in FEDDR_DATA_DIR")
def test_command_1_runs_verbatim_from_the_root_of_a_fresh_copy(tmp_path):
    """Slow (about 2 min on 2 CPU cores: the quickstart's live runs). The copy's parent holds no results/,
    so a chapter that looks for results/ beside its working directory fails here."""
    clone = fresh_copy(tmp_path / "clone")
    assert not (clone / ".venv").exists() and (clone / "results").is_dir()
    assert (Path(sys.prefix) / "bin" / "papermill").is_file(), f"papermill is not installed in {sys.prefix}"
    (clone / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    # a session of its own, ended with papermill's kernel (a session of its own too) when the test ends, however
    # it ends: a timeout, a failure, or this process killed at CI's time limit (then by the watchdog)
    proc = subprocess.Popen(["bash", "-c", after_install(readme_command_1())], cwd=clone, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    watchdog = guard(proc)
    try:
        _, stderr = proc.communicate(timeout=3600)
    finally:
        end_tree(proc, watchdog)
    assert proc.returncode == 0, stderr[-4000:]
    results = json.loads((clone / "runs" / "quickstart" / "results.json").read_text())
    assert {"feddr+", "fedavg"} <= set(results["results"]), results
    executed = nbformat.read(clone / "runs" / "00_quickstart.ipynb", as_version=4)
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors and all(c.execution_count for c in executed.cells if c.cell_type == "code" and c.source.strip())
