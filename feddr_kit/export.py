"""A finished run's global model for use elsewhere: its weights alone, and a JSON that says how to rebuild it.

``checkpoint.pt`` holds everything a resume needs (RNG states, history, the algorithm's state), so it
must be read with ``torch.load(weights_only=False)``, which runs pickled code. :func:`export_model`
writes only the reported global weights (what the run's summary evaluated: the algorithm's
``eval_state``) as a plain tensor file, ``.pt`` (readable with ``torch.load(weights_only=True)``)
or ``.safetensors`` (when the ``safetensors`` package is installed), and next to it a JSON with the
model name, the class names, the input normalization and the run's Config. :func:`load_model`
rebuilds the :class:`~feddr_kit.models.Net` from the two.

Both files are written atomically and read through the run folder's checked readers
(:mod:`feddr_kit.rundir`): a broken file is one line naming it, never a half-written file left behind.

Command line: ``python -m feddr_kit export RUN_DIR --to model.pt``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .build import build_algorithm
from .clients import load_data
from .config import Config
from .errors import FeddrKitError, StorageError, report
from .models import Net
from .rundir import (CHECKPOINT, load_checkpoint, read_checked, read_json, read_weights, torch_bytes, writable_folder,
                     write_bytes, write_json)

FORMAT = 1  # the layout of the JSON this code writes and reads
SUFFIXES = (".pt", ".safetensors")
SAFETENSORS_MISSING = "the safetensors package is not installed: pip install safetensors, or export to a .pt file"


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise FeddrKitError(SAFETENSORS_MISSING) from None
    return safetensors.torch


def sidecar(weights: str | Path) -> Path:
    """The JSON that goes with a weights file: ``model.pt`` -> ``model.json``."""
    return Path(weights).with_suffix(".json")


class _Shape:
    """What :func:`build_algorithm` reads of the data: the number of classes and the image shape."""

    def __init__(self, num_classes: int, image_shape: tuple[int, ...]):
        self.num_classes, self.image_shape = num_classes, tuple(image_shape)


def _reported_state(cfg: Config, ckpt: dict, num_classes: int, image_shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    algo, _ = build_algorithm(cfg, _Shape(num_classes, image_shape), torch.device("cpu"))
    algo.load_state_dict(ckpt["algorithm_state"])
    return {k: v.detach().cpu().contiguous() for k, v in algo.eval_state(ckpt["global_state"]).items()}


def export_model(run_dir: str | Path, to: str | Path) -> Path:
    """Write the finished run in ``run_dir``'s reported global weights to ``to`` (``.pt`` or ``.safetensors``)
    and its description to :func:`sidecar` (model, algorithm, classes, image shape, normalization, round,
    Config). Loads the run's dataset once for the class names and the normalization. Raises a one-line
    :class:`FeddrKitError` for a folder that holds no finished run (or a broken one), a file name of another
    kind or a destination that cannot be written (checked before any work), and a
    :class:`~feddr_kit.errors.StorageError` when a write fails (then neither file of the pair is left).
    Returns the JSON's path."""
    run_dir, to = Path(run_dir), Path(to)
    if to.suffix not in SUFFIXES:
        raise FeddrKitError(f"--to: {to} must end in .pt or .safetensors")
    if to.suffix == ".safetensors":
        _safetensors()
    if to.is_dir():
        raise FeddrKitError(f"--to: {to} is a folder; pass a file name ending in .pt or .safetensors")
    if not (run_dir / CHECKPOINT).is_file() or not (run_dir / "config.json").is_file():
        raise FeddrKitError(f"{run_dir} is not a run folder (no config.json and {CHECKPOINT})")
    with writable_folder(to.parent, "--to"):
        cfg = Config.from_saved(read_json(run_dir / "config.json", "export"), run_dir / "config.json", "export")
        ckpt = load_checkpoint(run_dir / CHECKPOINT, "export", "so it cannot be exported: run that run again")
        if ckpt["next_round"] < cfg.rounds:
            raise FeddrKitError(f"{run_dir}: the run stopped after {ckpt['next_round']} of {cfg.rounds} rounds; "
                                "resume it to the end first (python -m feddr_kit run --out-dir DIR --resume)")
        data = load_data(cfg)
        state = _reported_state(cfg, ckpt, data.num_classes, data.image_shape)
        info = {"format": FORMAT, "weights": to.name, "model": cfg.model, "algorithm": cfg.algorithm,
                "num_classes": data.num_classes, "classes": list(data.classes), "image_shape": list(data.image_shape),
                "normalization": {"mean": data.mean.tolist(), "std": data.std.tolist(),
                                  "formula": "(x / 255 - mean) / std per channel, x uint8 [B, 3, H, W]"},
                # the run's folder on the exporting machine means nothing where the file is read
                "round": int(ckpt["next_round"]), "config": cfg.replace(out_dir=None).to_dict()}
        # serialised in memory, then written with plain file I/O: a full disk is one OSError, whatever the format
        payload = _safetensors().save(state) if to.suffix == ".safetensors" else torch_bytes(state)
        write_bytes(to, payload)
        try:
            write_json(sidecar(to), info)
        except StorageError:  # weights without their description cannot be loaded: take them back
            to.unlink(missing_ok=True)
            raise
    return sidecar(to)


def load_model(path: str | Path, device: str | torch.device = "cpu") -> Net:
    """The :class:`~feddr_kit.models.Net` exported by :func:`export_model`, in eval mode on ``device``.
    ``path``: the weights file or its JSON. Built as the run built it (its algorithm installs the head; the
    memory layout its config records), then the weights are loaded strictly; the caller's torch random state
    is left as it was. Raises a one-line :class:`FeddrKitError` when a file is missing, broken or holds more than tensors (a ``.pt``
    is read with ``weights_only=True``), or the weights do not fit the model."""
    path = Path(path)
    info_path = path if path.suffix == ".json" else sidecar(path)
    if not info_path.is_file():
        raise FeddrKitError(f"load_model: {info_path} is missing; export the run with python -m feddr_kit export")
    info = read_json(info_path, "load_model")
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        found = info.get("format") if isinstance(info, dict) else type(info).__name__
        raise FeddrKitError(f"load_model: {info_path} has format {found!r}; this feddr_kit reads {FORMAT}")
    missing = [k for k in ("weights", "config", "num_classes", "image_shape") if k not in info]
    if missing:
        raise FeddrKitError(f"load_model: {info_path} lacks {', '.join(missing)}; export the run again")
    weights = info_path.parent / info["weights"]
    if not weights.is_file():
        raise FeddrKitError(f"load_model: the weights file {weights} named in {info_path} is missing")
    cfg = Config.from_saved(info["config"], info_path, "load_model")
    if weights.suffix == ".safetensors":
        state = read_checked(weights, "load_model", lambda p: _safetensors().load_file(str(p)))
    else:
        state = read_weights(weights, "load_model")
    rng = torch.get_rng_state()  # the build seeds torch's global RNG; a caller's stream is left as it was
    try:
        _, model = build_algorithm(cfg, _Shape(info["num_classes"], info["image_shape"]), torch.device("cpu"))
    finally:
        torch.set_rng_state(rng)
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as err:  # wrong shapes or names; a file of something else
        raise FeddrKitError(f"load_model: {weights} does not fit model {cfg.model!r}: "
                            f"{(str(err).splitlines() or [type(err).__name__])[0]}") from None
    # in the run's memory layout (its config records the one it used), so the net computes what the run's did,
    # to the float rounding; an export from before the layout was recorded says None: the contiguous one
    layout = torch.channels_last if cfg.channels_last else torch.contiguous_format
    return model.to(device, memory_format=layout).eval()


def main(args: dict[str, Any]) -> int:
    """``python -m feddr_kit export RUN_DIR --to FILE``: prints where the files went; 2 on bad input (an
    unreadable run, a destination that cannot be written), 3 when a write fails."""
    try:
        info = export_model(args["run_dir"], args["to"])
    except FeddrKitError as err:
        return report(err)
    print(f"weights in {args['to']}, description in {info}; load with fk.load_model({str(args['to'])!r})")
    return 0
