"""A run's folder: who owns it, how its files are written, and its checkpoints.

Ownership: one run per folder, no results mixed, no debris left. :func:`claim` is what
:func:`feddr_kit.run` holds for its lifetime. On entry it makes sure the
folder can be written (before any data is loaded), takes the folder's lock, removes the temporary
files of killed runs, and refuses a fresh run into a folder holding another run's results unless
``overwrite`` (which then removes them). On exit, normal or not, it releases the lock.

The lock is the file ``.lock`` in the folder, holding the owner's pid and host, locked through the
``filelock`` package (``flock`` on Unix), which the operating system releases when its process dies, so a
lock left by a killed run is recognized as stale and taken over (with a warning) instead of blocking the
folder for ever. Before each write a run checks that ``.lock`` is still the file it locked
(:func:`check_owner`): were it deleted, a second run could claim the folder, so the first stops.

Files: every result file is written atomically (:func:`atomic_write`: a temporary file, then a
rename), so a killed run never leaves a torn file; every file a command reads goes through
:func:`read_checked`, so a broken one is one line naming it, and a command checks that its output folder
can be written before it works (:func:`writable_folder`). Checkpoints: :func:`save_checkpoint` writes the
global state, the algorithm's state, the history and the RNG states; :func:`read_checkpoint` checks
that a config may continue one, and :func:`restore` puts it back, so a resumed run continues bit for bit.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import socket
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import filelock
import numpy as np
import pandas as pd
import torch

from .errors import BusyError, FeddrKitError, StorageError

LOCK = ".lock"
CHECKPOINT = "checkpoint.pt"
# The files a run writes.
RESULT_FILES = ("config.json", "history.csv", "summary.json", CHECKPOINT)
# The ones whose presence means the folder holds a run's results. A config.json alone is a run that stopped
# (diverged or was killed) before its first checkpoint: nothing to resume or lose, so a fresh run replaces it.
HELD_RESULTS = ("history.csv", "summary.json", CHECKPOINT)
# The checkpoint layout this code writes and reads (the keys of save_checkpoint's dict).
CHECKPOINT_VERSION = 1
# The optional key of the data and partition's fingerprint; a checkpoint without it (older) is resumed unchecked.
DATA_KEY = "data_fingerprint"
# Keys a checkpoint must hold to be resumed from.
CHECKPOINT_KEYS = ("next_round", "config", "global_state", "algorithm_state", "history", "round_seconds",
                   "torch_rng", "numpy_rng")
# Fields that may differ between a run and its resumption. rounds and lr change the results from the
# resumed round on (the schedule is recomputed; a smaller lr is the way on after a divergence).
RESUMABLE_CHANGES = {"rounds", "lr", "progress", "tensorboard", "out_dir", "overwrite", "checkpoint_every", "device"}
# Fields whose Config default has changed: the value a saved config (a checkpoint's, a config.json, a sweep's
# point.json or base) that leaves one out was run with. channels_last was False (NCHW) until its default became
# None (auto), and a run always records the layout it used, so a saved config without it is NCHW.
FORMER_DEFAULTS = {"channels_last": False}
# Fields whose None in a resuming config means "as the checkpoint ran": channels_last=None (auto) continues the
# layout the run chose when it started, on whatever machine it resumes; a True or False must equal it.
CONTINUED_WHEN_NONE = ("channels_last",)


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

    Creates it if needed; raises :class:`FeddrKitError` when it cannot be written, :class:`BusyError` when
    another live run holds it, or :class:`FeddrKitError` when a fresh run (``resume=False``) finds another run's results there
    (:data:`HELD_RESULTS`) and ``overwrite`` is false. A fresh run deletes the result files first: with
    ``overwrite`` all of them, else the ``config.json`` of a run that stopped before its first checkpoint.
    Temporary files of killed runs are deleted. The lock is released on exit.
    """
    created = make_folder(out_dir)
    try:
        lock = _lock(out_dir)
    except FeddrKitError:
        _remove_if_made(out_dir, created)
        raise
    try:
        for tmp in temp_files(out_dir):
            tmp.unlink(missing_ok=True)
        if not resume:
            found = [name for name in RESULT_FILES if (out_dir / name).exists()]
            if any(name in HELD_RESULTS for name in found) and not overwrite:
                raise FeddrKitError(
                    f"out_dir: {out_dir} already holds a run's results ({', '.join(found)}); pass resume=True "
                    "(--resume) to continue it, overwrite=True (--overwrite) to replace it, or another out_dir")
            for name in found:
                (out_dir / name).unlink(missing_ok=True)
        yield out_dir
    finally:
        _unlock(out_dir, lock)
        _remove_if_made(out_dir, created)


def _remove_if_made(out_dir: Path, created: bool) -> None:
    if created:  # a folder this run made and left empty (it failed early) goes again
        with contextlib.suppress(OSError):
            out_dir.rmdir()


def make_folder(folder: Path, who: str = "out_dir") -> bool:
    """Create ``folder`` (and parents); True when it did not exist. One-line :class:`FeddrKitError` naming
    ``who`` (the argument that gave the folder) when it is a file or cannot be created."""
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = f"{blocker}" if blocker == folder else f"cannot create the folder {folder}: {blocker}"
        raise FeddrKitError(f"{who}: {where} is a file, not a folder; pass a folder path")
    existed = folder.is_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise FeddrKitError(f"{who}: cannot create the folder {folder} ({err.strerror or err}); "
                            "pass a folder you can write to") from None
    return not existed


@contextlib.contextmanager
def writable_folder(folder: Path, who: str) -> Iterator[Path]:
    """Check, before a command does its work, that its files can go into ``folder``; yields ``folder``.

    Creates it (and parents) and writes and removes a temporary file there. A file in the way, a folder
    that cannot be created or written: one-line :class:`FeddrKitError` naming ``who``. The folders made
    here and still empty on exit (the command failed before writing) are removed again.
    """
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first; all of them, once created
    make_folder(folder, who)
    try:
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check.", suffix=".tmp")
            os.close(fd)
            os.remove(probe)
        except OSError as err:
            raise FeddrKitError(f"{who}: cannot write in {folder} ({err.strerror or err}); "
                                "pass a folder you can write to") from None
        yield folder
    finally:
        for p in made:
            try:
                p.rmdir()
            except OSError:  # not empty: the command wrote there
                break


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 200).decode(errors="replace").strip()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# The lock files this process holds: path -> (device, inode) of the file it locked. A write into a held
# folder first checks that ``.lock`` is still that file (:func:`check_owner`).
_HELD: dict[Path, tuple[int, int]] = {}
# How long a start waits for a lock that is being released (a live owner is refused after it).
LOCK_WAIT_S = 0.5


def _lock(out_dir: Path) -> filelock.BaseFileLock:
    """Take ``out_dir/.lock``; returns the held lock. Refuses a lock that a live process holds.

    The lock is the ``filelock`` package's (``flock`` on Unix, ``LockFileEx`` on Windows): the operating
    system releases it when its process dies, so a lock left by a killed run is taken over with a warning
    naming that run. The file holds the owner's pid and host while held, and is emptied and removed on
    release, so a non-empty file found unlocked was left by a run that died.
    """
    path = out_dir / LOCK
    previous: list[str] = []

    def stamp(fd: int) -> None:  # called by filelock with the file locked, before anyone else can read it
        previous.append(_holder(fd))
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())

    # thread_local=False: the lock belongs to the run, not to a thread; a second claim in the same process
    # is a second lock object and is refused like another process. A short wait lets a start that met a
    # lock file being removed by its releasing owner retry on the new one.
    lock = filelock.FileLock(path, timeout=LOCK_WAIT_S, thread_local=False, on_acquired=stamp)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise BusyError(f"out_dir: {out_dir} is in use by another run ({_read_holder(path) or 'starting'}); "
                            "wait for it to end or pass another out_dir") from None
    except OSError as err:
        raise FeddrKitError(f"out_dir: cannot write in {out_dir} ({err.strerror or err}); "
                            "pass a folder you can write to") from None
    if previous and previous[0]:
        warnings.warn(f"taking over the lock of a run that no longer exists ({previous[0]}) in {out_dir}",
                      stacklevel=4)
    _HELD[path] = _identity(path)
    return lock


def _read_holder(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()[:200]
    except OSError:
        return ""


def check_owner(out_dir: Path) -> None:
    """Raise :class:`FeddrKitError` when this process claimed ``out_dir`` but its ``.lock`` is no longer the
    file it locked (it was deleted, so another run may have claimed the folder since). A no-op for a
    folder this process did not claim (a Flower ServerApp writes into the folder its parent claimed)."""
    path = out_dir / LOCK
    held = _HELD.get(path)
    if held is not None and _identity(path) != held:
        raise FeddrKitError(f"out_dir: the lock file {path} was removed while this run held the folder, so another "
                            "run may be writing there; this run stopped without writing. Never delete .lock "
                            "of a running run")


def _unlock(out_dir: Path, lock: filelock.BaseFileLock) -> None:
    path = out_dir / LOCK
    held = _HELD.pop(path, None)
    # Empty and remove the file before unlocking, and only when it is still ours: a run waiting on this file
    # sees it is gone and retries on a new one; a file that replaced ours belongs to another run.
    if held is not None and _identity(path) == held:
        with contextlib.suppress(OSError):
            os.truncate(path, 0)
            path.unlink()
    lock.release()


# --------------------------------------------------------------------------- atomic writes
def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Write a file through ``write(tmp_path)`` then rename it over ``path``: never a torn file.

    Into a folder this process claimed, only while it still owns it (:func:`check_owner`). A failed
    write (a full disk, a quota, a lost mount) raises :class:`StorageError` naming the file, with the
    file at ``path`` left as it was.
    """
    check_owner(path.parent)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.chmod(tmp, FILE_MODE)  # the mode a plain open() gives, not mkstemp's 0600
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:  # a writer that is not plain file I/O may report a short write as a RuntimeError
        raise StorageError(f"cannot write {path} ({_reason(err, path.parent)}); the files written before are "
                           "intact: free space (or pass another out_dir) and resume") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def _reason(err: BaseException, folder: Path) -> str:
    """A short reason for a failed write: the OS's words, else the first line of the error, with the free space."""
    text = getattr(err, "strerror", None) or (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
    with contextlib.suppress(OSError):
        text += f"; {shutil.disk_usage(folder).free / 2**20:.1f} MiB free there"
    return text


def torch_bytes(obj: Any) -> bytes:
    """``obj`` (tensors, dicts, lists of them) serialised by ``torch.save``, in memory. Writing these bytes with
    plain file I/O makes a failed write (a full disk, a file-size limit) the OS's ``OSError``, named like any
    other file's: torch's own file writer reports one in its archive's words and, failing again as it closes
    the half-written archive, can abort the whole process."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def write_bytes(path: Path, payload: bytes) -> None:
    """Atomically write ``payload`` to ``path`` (e.g. :func:`torch_bytes`'s)."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(payload))


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
                    round_seconds: list[float], cfg, data_fingerprint: dict | None = None) -> None:
    """Write ``out_dir/checkpoint.pt`` and ``history.csv``.

    The checkpoint holds the global state (name -> tensor, saved on the CPU), ``algo.state_dict()``,
    the history ``rows``, the ``round_seconds`` so far, ``cfg.to_dict()``, torch's and NumPy's
    global RNG states and, when given, ``data_fingerprint`` (:func:`feddr_kit.clients.fingerprint`; an
    optional key :data:`DATA_KEY`, so checkpoints written before it existed stay readable);
    ``next_round`` is the 0-based round a resume starts with.
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
    if data_fingerprint is not None:
        ckpt[DATA_KEY] = data_fingerprint
    write_bytes(out_dir / CHECKPOINT, torch_bytes(ckpt))
    write_text(out_dir / "history.csv", pd.DataFrame(rows).to_csv(index=False))


def load_checkpoint(path: Path, who: str, advice: str) -> dict:
    """``torch.load`` of a checkpoint on the CPU, with every key of :data:`CHECKPOINT_KEYS`; a truncated or
    foreign file raises a one-line :class:`FeddrKitError` ``"<who>: <path> is unreadable (...); it was left
    in place, <advice>"``."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        missing = [k for k in CHECKPOINT_KEYS if k not in ckpt]
    except Exception as err:  # truncated, not a torch file, not a dict: all mean the same to the user
        reason = (str(err).splitlines() or [type(err).__name__])[0][:120]
        raise FeddrKitError(f"{who}: {path} is unreadable ({type(err).__name__}: {reason}); it was left in place, "
                            f"{advice}") from None
    if missing:
        raise FeddrKitError(f"{who}: {path} is unreadable (not a feddr_kit checkpoint: no {', '.join(missing)}); "
                            f"it was left in place, {advice}")
    return ckpt


def read_checked(path: Path, who: str, read: Callable[[Path], Any]) -> Any:
    """``read(path)``, with every failure to read it (missing, unreadable, empty, truncated, undecodable,
    of another kind) as a one-line :class:`FeddrKitError` ``"<who>: cannot read <path> (<error>: <reason>)"``."""
    try:
        return read(path)
    except Exception as err:  # each format fails in its own words; to the user they all mean the same
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        raise FeddrKitError(f"{who}: cannot read {path} ({type(err).__name__}: {reason})") from None


def read_json(path: Path, who: str) -> Any:
    """The JSON in ``path`` (:func:`read_checked`)."""
    return read_checked(path, who, lambda p: json.loads(p.read_text()))


def read_csv(path: Path, who: str) -> pd.DataFrame:
    """The table in the CSV file ``path`` (:func:`read_checked`: an empty or cut file is one line too)."""
    return read_checked(path, who, pd.read_csv)


def read_weights(path: Path, who: str) -> dict[str, torch.Tensor]:
    """The tensors in a ``.pt`` file of tensors alone, on the CPU (:func:`read_checked`). Read with
    ``torch.load(weights_only=True)``, so a file that holds pickled objects is refused, never run."""
    return read_checked(path, who, lambda p: torch.load(p, map_location="cpu", weights_only=True))


def read_checkpoint(out_dir: Path, cfg, default_regularizer: str, default_lr: float | None = None) -> dict:
    """Read ``out_dir/checkpoint.pt`` for a resume of ``cfg`` and check that ``cfg`` may continue it.

    Raises :class:`FeddrKitError` (one line, the file left in place) when it is missing, unreadable
    or of another :data:`CHECKPOINT_VERSION`, when a field outside :data:`RESUMABLE_CHANGES` differs
    (a field of :data:`CONTINUED_WHEN_NONE` that ``cfg`` leaves at None takes the checkpoint's value:
    :func:`continued`; one the checkpoint's config lacks is compared at :data:`FORMER_DEFAULTS`),
    or when ``cfg.rounds`` is below the rounds already done. A changed ``rounds`` or ``lr`` is
    announced with a warning. ``default_regularizer``: the regularizer ``cfg.algorithm`` uses when none
    is named, which is what a checkpoint that recorded ``regularizer=None`` (older versions) used;
    ``default_lr``: the initial lr ``cfg``'s algorithm uses for its model when ``lr`` is None, so that the
    warning names the lr each run used.
    """
    path = out_dir / CHECKPOINT
    if not path.exists():
        raise FeddrKitError(f"resume=True but there is no checkpoint at {path}; run without resume first")
    ckpt = load_checkpoint(path, "resume", "move it away to start afresh with overwrite")
    if ckpt.get("version") != CHECKPOINT_VERSION:
        raise FeddrKitError(f"resume: {path} is a checkpoint of version {ckpt.get('version')!r}, but this feddr_kit "
                            f"reads version {CHECKPOINT_VERSION}; resume it with the feddr_kit that wrote it")
    saved = {**FORMER_DEFAULTS, **ckpt["config"]}
    if saved.get("regularizer") is None:
        saved["regularizer"] = default_regularizer
    refused = refused_changes(saved, {**cfg.to_dict(), **continued(ckpt, cfg.to_dict())})
    if refused:
        raise FeddrKitError(f"resume: {len(refused)} config field(s) differ from the checkpoint's (saved -> asked): "
                            f"{'; '.join(refused)}; only {', '.join(sorted(RESUMABLE_CHANGES))} may change on resume")
    done = ckpt["next_round"]
    if cfg.rounds < done:
        raise FeddrKitError(f"rounds: {done} rounds are already done in {path}; resume with rounds >= {done}")
    if saved["rounds"] != cfg.rounds:
        warnings.warn(f"resuming with rounds={cfg.rounds} instead of {saved['rounds']}: the lr schedule is recomputed",
                      stacklevel=5)
    old_lr, new_lr = (default_lr if v is None else v for v in (saved.get("lr"), cfg.lr))
    if old_lr != new_lr:
        warnings.warn(f"resuming with lr={new_lr} instead of {old_lr} from round {done + 1} on", stacklevel=5)
    return ckpt


def continued(ckpt: dict, wanted: dict) -> dict[str, Any]:
    """The fields of :data:`CONTINUED_WHEN_NONE` that the resuming config ``wanted`` (a dict) leaves at None, with
    the values the checkpoint ``ckpt`` ran with (:data:`FORMER_DEFAULTS` where its config has none): what the
    resumed run must use to continue it bit for bit (``{"channels_last": False}`` for an NCHW checkpoint)."""
    saved = {**FORMER_DEFAULTS, **ckpt["config"]}
    return {name: saved[name] for name in CONTINUED_WHEN_NONE if wanted.get(name) is None}


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
