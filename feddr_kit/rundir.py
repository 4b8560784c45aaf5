"""A run's folder: who owns it, how its files are written, and its checkpoints.

Ownership: one run per folder, no results mixed, no debris left. :func:`claim` is what
:func:`feddr_kit.run` holds for its lifetime. On entry it makes sure the
folder can be written (before any data is loaded), takes the folder's lock, removes the temporary
files of killed runs, and refuses a fresh run into a folder holding another run's results unless
``overwrite`` (which then removes them). On exit, normal or not, it releases the lock.

The lock is the file ``.lock`` in the folder, holding the owner's pid and host. It is held with
``flock``, which the kernel releases when its process dies, so a lock left by a killed run is
recognized as stale and taken over (with a warning) instead of blocking the folder for ever.

Files: every result file is written atomically (:func:`atomic_write`: a temporary file, then a
rename), so a killed run never leaves a torn file. Checkpoints: :func:`save_checkpoint` writes the
global state, the algorithm's state, the history and the RNG states; :func:`read_checkpoint` checks
that a config may continue one, and :func:`restore` puts it back, so a resumed run continues bit for bit.
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import socket
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd
import torch

from .errors import FeddrKitError

try:
    import fcntl
except ImportError:  # Windows: an exclusive-create lock, which a killed run leaves behind
    fcntl = None

LOCK = ".lock"
CHECKPOINT = "checkpoint.pt"
# The files a run writes; their presence means the folder already holds a run's results.
RESULT_FILES = ("config.json", "history.csv", "summary.json", CHECKPOINT)
# The checkpoint layout this code writes and reads (the keys of save_checkpoint's dict).
CHECKPOINT_VERSION = 1
# Keys a checkpoint must hold to be resumed from.
CHECKPOINT_KEYS = ("next_round", "config", "global_state", "algorithm_state", "history", "round_seconds",
                   "torch_rng", "numpy_rng")
# Fields that may differ between a run and its resumption. rounds and lr change the results from the
# resumed round on (the schedule is recomputed; a smaller lr is the way on after a divergence).
RESUMABLE_CHANGES = {"rounds", "lr", "progress", "tensorboard", "out_dir", "overwrite", "checkpoint_every", "device"}


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


# --------------------------------------------------------------------------- atomic writes
def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Write a file through ``write(tmp_path)`` then rename it over ``path``: never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, FILE_MODE)  # the mode a plain open() gives, not mkstemp's 0600
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path: Path, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON (NaN written as null; NumPy scalars as numbers)."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if isinstance(v, (np.floating, np.integer)):
            return clean(v.item())
        return v

    write_text(path, json.dumps(clean(obj), indent=2) + "\n")


# --------------------------------------------------------------------------- checkpoints
def save_checkpoint(out_dir: Path, next_round: int, global_state: dict[str, torch.Tensor], algo, rows: list[dict],
                    round_seconds: list[float], cfg) -> None:
    """Write ``out_dir/checkpoint.pt`` and ``history.csv``.

    The checkpoint holds the global state (name -> tensor, saved on the CPU), ``algo.state_dict()``,
    the history ``rows``, the ``round_seconds`` so far, ``cfg.to_dict()`` and torch's and NumPy's
    global RNG states; ``next_round`` is the 0-based round a resume starts with.
    """
    ckpt = {
        "version": CHECKPOINT_VERSION,
        "next_round": next_round,
        "config": cfg.to_dict(),
        "global_state": {k: v.cpu() for k, v in global_state.items()},
        "algorithm_state": algo.state_dict(),
        "history": rows,
        "round_seconds": round_seconds,
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
    }
    atomic_write(out_dir / CHECKPOINT, lambda tmp: torch.save(ckpt, tmp))
    write_text(out_dir / "history.csv", pd.DataFrame(rows).to_csv(index=False))


def read_checkpoint(out_dir: Path, cfg, default_regularizer: str) -> dict:
    """Read ``out_dir/checkpoint.pt`` for a resume of ``cfg`` and check that ``cfg`` may continue it.

    Raises :class:`FeddrKitError` (one line, the file left in place) when it is missing, unreadable
    or of another :data:`CHECKPOINT_VERSION`, when a field outside :data:`RESUMABLE_CHANGES` differs,
    or when ``cfg.rounds`` is below the rounds already done. A changed ``rounds`` or ``lr`` is
    announced with a warning. ``default_regularizer``: the regularizer ``cfg.algorithm`` uses when none
    is named, which is what a checkpoint that recorded ``regularizer=None`` (older versions) used.
    """
    path = out_dir / CHECKPOINT
    if not path.exists():
        raise FeddrKitError(f"resume=True but there is no checkpoint at {path}; run without resume first")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        missing = [k for k in CHECKPOINT_KEYS if k not in ckpt]
    except Exception as err:  # truncated, not a torch file, not a dict: all mean the same to the user
        reason = (str(err).splitlines() or [type(err).__name__])[0][:120]
        raise FeddrKitError(f"resume: {path} is unreadable ({type(err).__name__}: {reason}); it was left in place, "
                            "move it away to start afresh with overwrite") from None
    if missing:
        raise FeddrKitError(f"resume: {path} is unreadable (not a feddr_kit checkpoint: no {', '.join(missing)}); "
                            "it was left in place, move it away to start afresh with overwrite")
    if ckpt.get("version") != CHECKPOINT_VERSION:
        raise FeddrKitError(f"resume: {path} is a checkpoint of version {ckpt.get('version')!r}, but this feddr_kit "
                            f"reads version {CHECKPOINT_VERSION}; resume it with the feddr_kit that wrote it")
    saved = dict(ckpt["config"])
    if saved.get("regularizer") is None:
        saved["regularizer"] = default_regularizer
    refused = refused_changes(saved, cfg.to_dict())
    if refused:
        raise FeddrKitError(f"resume: {len(refused)} config field(s) differ from the checkpoint's (saved -> asked): "
                            f"{'; '.join(refused)}; only {', '.join(sorted(RESUMABLE_CHANGES))} may change on resume")
    done = ckpt["next_round"]
    if cfg.rounds < done:
        raise FeddrKitError(f"rounds: {done} rounds are already done in {path}; resume with rounds >= {done}")
    if saved["rounds"] != cfg.rounds:
        warnings.warn(f"resuming with rounds={cfg.rounds} instead of {saved['rounds']}: the lr schedule is recomputed",
                      stacklevel=5)
    if saved.get("lr") != cfg.lr:
        warnings.warn(f"resuming with lr={cfg.lr} instead of {saved.get('lr')} from round {done + 1} on",
                      stacklevel=5)
    return ckpt


def refused_changes(saved: dict, wanted: dict) -> list[str]:
    """Every field outside :data:`RESUMABLE_CHANGES` where ``wanted`` differs from the ``saved`` config, as
    ``"name: saved -> wanted"``; a field the saved config lacks (written before it existed) is not compared."""
    def same(a: Any, b: Any) -> bool:  # a JSON list and a tuple of the same values are the same setting
        return (list(a) if isinstance(a, tuple) else a) == (list(b) if isinstance(b, tuple) else b)

    return [f"{name}: {saved[name]!r} -> {value!r}" for name, value in wanted.items()
            if name not in RESUMABLE_CHANGES and name in saved and not same(saved[name], value)]


def restore(ckpt: dict, algo, device: torch.device) -> tuple[int, dict[str, torch.Tensor], list[dict], list[float]]:
    """Put back a checkpoint read by :func:`read_checkpoint`: ``algo``'s state and the global RNGs.

    Returns ``(next_round, global_state on device, history rows, round_seconds)``.
    """
    algo.load_state_dict(ckpt["algorithm_state"])
    torch.set_rng_state(ckpt["torch_rng"])
    np.random.set_state(ckpt["numpy_rng"])
    state = {k: v.to(device) for k, v in ckpt["global_state"].items()}
    return ckpt["next_round"], state, list(ckpt["history"]), list(ckpt["round_seconds"])
