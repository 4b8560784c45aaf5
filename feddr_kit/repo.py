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

    The nearest folder at or above ``start`` (default: the working directory; a relative ``start`` is taken
    from it) that :func:`is_repo`; else ``installed`` (default: the folder above the imported ``feddr_kit``
    package) when it is one, which is also the answer when the working directory has been deleted.
    The working directory comes first so that a second clone runs on its own files. Raises
    ``FeddrKitError`` when neither is a repository (a copy of the package installed without its
    repository, run from outside a clone).
    """
    begin = _start(start)
    for folder in (begin, *begin.parents) if begin is not None else ():
        if is_repo(folder):
            return folder
    installed = PACKAGE_REPO if installed is None else Path(installed).resolve()
    if is_repo(installed):
        return installed
    where = begin if begin is not None else (
        "the working directory, which was deleted" if start is None
        else f"{start} (relative to the working directory, which was deleted)")
    raise FeddrKitError(f"no feddr_kit repository (a folder with pyproject.toml, feddr_kit/ and results/) at or above "
                        f"{where}, nor where feddr_kit is installed ({installed}): start from inside a clone of the "
                        "repository, or install the clone with `pip install -e .`")


def _start(start: str | Path | None) -> Path | None:
    """``start`` as an absolute path (default: the working directory), or None when it cannot be made one
    because the working directory was deleted (a notebook whose folder was removed under it): then there is
    nothing to search upward from, and the installed copy answers."""
    try:
        return Path.cwd() if start is None else Path(start).resolve()
    except FileNotFoundError:
        return None


def results(start: str | Path | None = None) -> Path:
    """The repository's ``results/`` folder: the committed sweeps' scripts, CSVs and measurements (see :func:`root`)."""
    return root(start) / "results"
