"""Every chapter that reads the repository's committed evidence (results/) finds it wherever it is
started from: papermill and nbval run a notebook in the folder they are called from, not the
notebook's own, so a chapter started from the repository root or from any other folder must load
the same files as one started from notebooks/ (which nbval and tests/chapter_cells.py cover).

Each test runs a chapter's loading cells (its parameters, its setup, the cells that read results/;
not its training) in a fresh interpreter with the kit importable from this repository, as an
editable install makes it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chapter_cells import NOTEBOOKS, cifar10_available, code, exec_cells, run

REPO = NOTEBOOKS.parent

# chapter: (the first lines of the code cells to run after the parameters cell, an expression that counts what was read)
LOADING = {
    "00_quickstart": (("from pathlib import Path", "data = fk.data.load", "RESULTS = "), "len(ns['curves'])"),
    "03_dr_forgets_unseen": (("import json",), "len(ns['stored']['seeds'])"),  # its CSV cell also evaluates a model: slow
    "04_feature_distillation": (("import json", "if use_stored:"), "len(ns['seed_hist'])"),
    "05_nine_algorithms": (("import sys",), "len(ns['runs'])"),
    "06_regularizer_synergy": (("import sys",), "len(ns['runs'])"),
    "07_sensitivity": (("import sys",), "len(ns['runs'])"),
    "08_personalization": (("import sys", "import ast"), "len(ns['pd'].read_csv(ns['results_csv']))"),
    "09_flower": (("import json", "costs = json.loads"), "len(ns['costs'])"),
}
NEEDS_CIFAR = {"00_quickstart", "03_dr_forgets_unseen", "04_feature_distillation"}  # their setup loads CIFAR-10


def loading_cells(chapter: str) -> list[str]:
    """The chapter's parameters cell, then the code cells named in LOADING, in order."""
    cells, starts = code(chapter), LOADING[chapter][0]
    picked = [next(s for s in cells if s.startswith(start)) for start in starts]
    assert len(set(picked)) == len(starts), f"{chapter}: LOADING names a cell twice"
    return [cells[0], *picked]


def load_from(chapter: str, cwd: Path) -> dict:
    """Run the chapter's loading cells from ``cwd``; return where results/ was found and how much was read."""
    tail = ("\nimport json\nprint(json.dumps({'results': str(ns.get('RESULTS', '')), "
            f"'read': int({LOADING[chapter][1]}), 'stored': ns.get('use_stored', True)}}))")
    out = run(exec_cells(loading_cells(chapter), tail), cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def skip_without_cifar(chapter: str) -> None:
    if chapter in NEEDS_CIFAR and not cifar10_available():
        pytest.skip("real CIFAR-10 not in FEDDR_DATA_DIR (the chapter's setup loads it)")


@pytest.mark.parametrize("chapter", LOADING)
def test_chapter_loads_its_evidence_from_the_repository_root(chapter):
    """As `papermill notebooks/<chapter>.ipynb ...` from the repository root (README's commands) runs it."""
    skip_without_cifar(chapter)
    got = load_from(chapter, REPO)
    assert got["read"] > 0 and got["stored"], got  # 03 and 04 would train their seeds instead of loading them
    if chapter != "09_flower":  # 09 reads one file and keeps no RESULTS
        assert Path(got["results"]) == REPO / "results"


@pytest.mark.parametrize("chapter", ["05_nine_algorithms", "09_flower"])  # RESULTS, and 09's costs_file default
def test_chapter_loads_its_evidence_from_an_unrelated_folder(chapter, tmp_path):
    """As JupyterLab or papermill started in a folder outside the clone runs it: the installed package says where
    the repository is."""
    skip_without_cifar(chapter)
    got = load_from(chapter, tmp_path)
    assert got["read"] > 0 and got["stored"], got
    if chapter != "09_flower":
        assert Path(got["results"]) == REPO / "results"


def test_chapter_with_no_repository_anywhere_says_so_in_one_line(tmp_path):
    """A copy of the package installed without its repository, started outside any clone: one clear line."""
    shutil.copytree(REPO / "feddr_kit", tmp_path / "site" / "feddr_kit", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "elsewhere").mkdir()
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(tmp_path / "site")}
    script = exec_cells(loading_cells("05_nine_algorithms"), "\nprint('loaded', ns['RESULTS'])")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path / "elsewhere", env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode != 0, out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("feddr_kit.errors.FeddrKitError: no feddr_kit repository"), out.stderr[-3000:]
    assert str(tmp_path / "elsewhere") in last and "pip install -e ." in last
