"""A run's ownership of its ``out_dir``: one run per folder, no results mixed, no debris left.

:func:`claim` is what :func:`feddr_kit.run` holds for its lifetime. On entry it makes sure the
folder can be written (before any data is loaded), takes the folder's lock, removes the temporary
files of killed runs, and refuses a fresh run into a folder holding another run's results unless
``overwrite`` (which then removes them). On exit, normal or not, it releases the lock.

The lock is the file ``.lock`` in the folder, holding the owner's pid and host. It is held with
``flock``, which the kernel releases when its process dies, so a lock left by a killed run is
recognized as stale and taken over (with a warning) instead of blocking the folder for ever.
"""
from __future__ import annotations

import contextlib
import errno
import os
import socket
import warnings
from pathlib import Path
from typing import Iterator

from .errors import FeddrKitError

try:
    import fcntl
except ImportError:  # Windows: an exclusive-create lock, which a killed run leaves behind
    fcntl = None

LOCK = ".lock"
# The files a run writes; their presence means the folder already holds a run's results.
RESULT_FILES = ("config.json", "history.csv", "summary.json", "checkpoint.pt")


def _umask() -> int:
    """The process umask, read without changing it (Linux), else by setting it back at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Mode of the result files: what a plain open() would give them (mkstemp alone gives 0600).
FILE_MODE = 0o666 & ~_umask()


def temp_files(out_dir: Path) -> list[Path]:
    """The temporary files of interrupted atomic writes in ``out_dir`` (``.<result file>.*.tmp``)."""
    return sorted(p for name in RESULT_FILES for p in out_dir.glob(f".{name}.*.tmp"))


@contextlib.contextmanager
def claim(out_dir: Path, *, resume: bool, overwrite: bool) -> Iterator[Path]:
    """Own ``out_dir`` for the duration of a run; yields it.

    Creates it if needed; raises :class:`FeddrKitError` when it cannot be written, when another
    live run holds it, or when a fresh run (``resume=False``) finds another run's result files
    there and ``overwrite`` is false. With ``overwrite`` (fresh runs only) those files are deleted
    first. Temporary files of killed runs are deleted. The lock is released on exit.
    """
    created = _make_folder(out_dir)
    try:
        fd = _lock(out_dir)
    except FeddrKitError:
        _remove_if_made(out_dir, created)
        raise
    try:
        for tmp in temp_files(out_dir):
            tmp.unlink(missing_ok=True)
        if not resume:
            found = [name for name in RESULT_FILES if (out_dir / name).exists()]
            if found and not overwrite:
                raise FeddrKitError(
                    f"out_dir: {out_dir} already holds a run's results ({', '.join(found)}); pass resume=True "
                    "(--resume) to continue it, overwrite=True (--overwrite) to replace it, or another out_dir")
            for name in found:
                (out_dir / name).unlink(missing_ok=True)
        yield out_dir
    finally:
        _unlock(out_dir, fd)
        _remove_if_made(out_dir, created)


def _remove_if_made(out_dir: Path, created: bool) -> None:
    if created:  # a folder this run made and left empty (it failed early) goes again
        with contextlib.suppress(OSError):
            out_dir.rmdir()


def _make_folder(out_dir: Path) -> bool:
    """Create ``out_dir`` (and parents); True when it did not exist. One-line error when impossible."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FeddrKitError(f"out_dir: {out_dir} is a file, not a folder; pass a folder path")
    existed = out_dir.is_dir()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FeddrKitError(f"out_dir: cannot create the folder {out_dir} ({err.strerror or err}); "
                            "pass a folder you can write to") from None
    return not existed


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 200).decode(errors="replace").strip()


def _lock(out_dir: Path) -> int:
    """Take ``out_dir/.lock``; returns its open descriptor. Refuses a lock that a live process holds."""
    path = out_dir / LOCK
    if fcntl is None:
        return _lock_exclusive_create(out_dir)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as err:
            raise FeddrKitError(f"out_dir: cannot write in {out_dir} ({err.strerror or err}); "
                                "pass a folder you can write to") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _holder(fd)
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise FeddrKitError(f"out_dir: cannot lock {path} ({err.strerror or err})") from None
            raise FeddrKitError(f"out_dir: {out_dir} is in use by another run ({holder or 'starting'}); "
                                "wait for it to end or pass another out_dir") from None
        try:  # the previous owner may have removed the file between our open and our flock: retry
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    stale = _holder(fd)
    if stale:
        warnings.warn(f"taking over the lock of a run that no longer exists ({stale}) in {out_dir}",
                      stacklevel=4)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return fd


def _lock_exclusive_create(out_dir: Path) -> int:
    """Without ``flock``: the lock is the file's existence; a stale one must be deleted by hand."""
    path = out_dir / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        raise FeddrKitError(f"out_dir: {out_dir} is in use by another run ({path.read_text(errors='replace').strip()}); "
                            f"wait for it to end, or delete {path} if that run no longer exists") from None
    except OSError as err:
        raise FeddrKitError(f"out_dir: cannot write in {out_dir} ({err.strerror or err}); "
                            "pass a folder you can write to") from None
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return fd


def _unlock(out_dir: Path, fd: int) -> None:
    # Unlink before closing: a run waiting on this inode sees it is gone and retries on a new file.
    with contextlib.suppress(OSError):
        (out_dir / LOCK).unlink()
    os.close(fd)
