"""Where the kit's repository is, so that a chapter finds the committed evidence in ``results/``
wherever it was started from.

A notebook's working directory depends on who runs it: JupyterLab and nbconvert use the notebook's
own folder, papermill and nbval the folder they are called from, ``fk.sweep.run_notebook_grid``
whatever it is told. So the repository is found by its marker files, searching upward from the
working directory, and else where the package itself is installed from (``pip install -e .``, as
requirements.txt does, installs it from the repository).
"""
from __future__ import annotations

from pathlib import Path

from .errors import FeddrKitError

PACKAGE_REPO = Path(__file__).resolve().parents[1]  # the repository for an editable install; site-packages otherwise


def is_repo(folder: str | Path) -> bool:
    """True when ``folder`` holds the repository's marker files: ``pyproject.toml``, ``feddr_kit/`` and ``results/``."""
    folder = Path(folder)
    return ((folder / "pyproject.toml").is_file() and (folder / "feddr_kit" / "__init__.py").is_file()
            and (folder / "results").is_dir())


def root(start: str | Path | None = None, installed: str | Path | None = None) -> Path:
    """The repository's root folder (absolute).

    The nearest folder at or above ``start`` (default: the working directory) that :func:`is_repo`;
    else ``installed`` (default: the folder above the imported ``feddr_kit`` package) when it is one.
    The working directory comes first so that a second clone runs on its own files. Raises
    ``FeddrKitError`` when neither is a repository (a copy of the package installed without its
    repository, run from outside a clone).
    """
    start = Path.cwd() if start is None else Path(start).resolve()
    for folder in (start, *start.parents):
        if is_repo(folder):
            return folder
    installed = PACKAGE_REPO if installed is None else Path(installed).resolve()
    if is_repo(installed):
        return installed
    raise FeddrKitError(f"no feddr_kit repository (a folder with pyproject.toml, feddr_kit/ and results/) at or above "
                        f"{start}, nor where feddr_kit is installed ({installed}): start from inside a clone of the "
                        "repository, or install the clone with `pip install -e .`")


def results(start: str | Path | None = None) -> Path:
    """The repository's ``results/`` folder: the committed sweeps' scripts, CSVs and measurements (see :func:`root`)."""
    return root(start) / "results"
