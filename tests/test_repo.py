"""fk.repo finds the repository from wherever a chapter is started: upward from the working directory
first, then where the package is installed from, and says in one line when neither is a repository."""
from __future__ import annotations

from pathlib import Path

import pytest

from feddr_kit import repo
from feddr_kit.errors import FeddrKitError

REPO = Path(__file__).resolve().parents[1]


def fake_repo(folder: Path) -> Path:
    """A folder with the repository's marker files and nothing else."""
    (folder / "feddr_kit").mkdir(parents=True)
    (folder / "feddr_kit" / "__init__.py").write_text("")
    (folder / "results").mkdir()
    (folder / "pyproject.toml").write_text("")
    return folder


@pytest.mark.parametrize("start", [".", "notebooks", "results", "feddr_kit/methods"])
def test_found_from_the_root_and_from_folders_inside_it(start):
    assert repo.root(REPO / start, installed="/nonexistent") == REPO
    assert repo.results(REPO / start) == REPO / "results"


def test_the_working_directory_is_the_default_start(tmp_path, monkeypatch):
    clone = fake_repo(tmp_path / "clone")
    (clone / "notebooks").mkdir()
    monkeypatch.chdir(clone / "notebooks")
    assert repo.root() == clone and repo.results() == clone / "results"


def test_the_clone_around_the_working_directory_wins_over_the_installed_one(tmp_path):
    """A second clone runs on its own results/, not on those of the clone the package is installed from."""
    clone = fake_repo(tmp_path / "clone")
    (clone / "notebooks" / "runs").mkdir(parents=True)
    assert repo.root(clone / "notebooks" / "runs", installed=REPO) == clone


def test_outside_any_clone_the_installed_repository_is_used(tmp_path):
    assert repo.root(tmp_path) == REPO  # the tests import the package from this repository
    assert repo.root(tmp_path, installed=REPO / "feddr_kit" / "..") == REPO


@pytest.mark.parametrize("missing", ["pyproject.toml", "feddr_kit/__init__.py", "results"])
def test_a_folder_missing_a_marker_is_not_the_repository(tmp_path, missing):
    folder = fake_repo(tmp_path / "almost")
    target = folder / missing
    target.rmdir() if target.is_dir() else target.unlink()
    assert not repo.is_repo(folder)
    assert repo.root(folder, installed=REPO) == REPO


def test_no_repository_anywhere_says_so_in_one_line(tmp_path):
    (tmp_path / "site-packages" / "feddr_kit").mkdir(parents=True)  # a copy installed without its repository
    with pytest.raises(FeddrKitError) as err:
        repo.root(tmp_path / "elsewhere", installed=tmp_path / "site-packages")
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_path / "elsewhere") in message and str(tmp_path / "site-packages") in message
    assert "pip install -e ." in message
