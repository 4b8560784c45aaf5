"""Command line: ``python -m feddr_kit run [--config FILE] [--field value ...]`` with every ``Config``
field as a flag, ``sweep --grid grid.yaml --root DIR`` for a grid of runs (:mod:`feddr_kit.sweep`),
``flower`` for one run under Flower (:mod:`feddr_kit.flower`), ``show PATH`` for a run's or a sweep's
results (:mod:`feddr_kit.show`), ``export RUN_DIR --to model.pt`` (:mod:`feddr_kit.export`) and
``personalize --run RUN_DIR`` (:mod:`feddr_kit.personalize`).

Where a command's settings come from, later winning: the Config defaults; with ``run --resume``, the
run's own ``config.json``; the ``--config`` file (YAML or JSON); the flags typed. So a resume needs
only what changes (``run --out-dir runs/x --resume --rounds 60``), and a run's ``config.json`` reruns
it elsewhere (``run --config runs/x/config.json --out-dir runs/y``). The flags typed are told apart
from the defaults by parsing the command line a second time with every default suppressed.
"""
from __future__ import annotations

import argparse
import json
import sys
import typing
import warnings
from dataclasses import MISSING, fields
from pathlib import Path

from .config import Config, is_none_word, read_file, read_mapping, whole_number
from .errors import FeddrKitError, report
from .flower import UNSUPPORTED
from .personalize import METHODS

# Fields a sweep sets itself (each run's folder and seed) or keeps off in its runs (their own progress).
SWEEP_SET = ("out_dir", "seed", "progress", "overwrite")
# Fields the flower command has no use for: what Flower's apps refuse (probes, the batched engine) and what only
# those use, and progress (the ServerApp prints its own).
FLOWER_UNSUPPORTED = tuple(UNSUPPORTED) + ("probe_samples", "precision", "channels_last", "fused_sgd", "progress")

EXAMPLE = "python -m feddr_kit run --dataset synthetic --rounds 4 --out-dir runs/try"
RESUME_EXAMPLE = "python -m feddr_kit run --out-dir runs/try --resume --rounds 8"
SWEEP_EXAMPLE = "python -m feddr_kit sweep --grid grid.json --root runs/grid"
SHOW_EXAMPLE = "python -m feddr_kit show runs/try"
FLOWER_EXAMPLE = ("python -m feddr_kit flower --dataset synthetic --num-clients 4 --clients-per-round 4 "
                  "--shards-per-client 5 --rounds 2 --out-dir runs/flower")


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_bool_or_auto(text: str) -> bool | None:
    """A ``bool | None`` flag (``--channels-last``): true/false as :func:`_parse_bool`, and auto (or none) for
    None, the field's "decided by the run" (the help text says what)."""
    if text.lower() in ("auto", "none"):
        return None
    try:
        return _parse_bool(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected true, false or auto, got {text!r}") from None


def _out_dir(text: str) -> str:
    if is_none_word(text):
        raise argparse.ArgumentTypeError("'none' is not taken as a folder name: leave out --out-dir to save "
                                         "nothing, or write ./none for a folder called none")
    return text


def _optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)
    parse.__name__ = kind.__name__
    return parse


def _integer(text: str) -> int:
    """An int flag read as a config file reads the field (``--rounds 1.0`` as ``rounds: 1.0``); argparse names the
    flag in its one-line error otherwise."""
    try:
        return whole_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def add_config_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = (), typed_only: bool = False) -> None:
    """One ``--flag`` per ``Config`` field on ``parser`` (dest: the field name), except the fields in ``skip``.
    ``typed_only``: every default suppressed, so the parsed namespace holds only the flags typed."""
    hints = typing.get_type_hints(Config)
    for f in fields(Config):
        if f.name in skip:
            continue
        hint = str(hints[f.name])
        default = f.default if f.default is not MISSING else f.default_factory()
        flag = "--" + f.name.replace("_", "-")
        kw = {"default": argparse.SUPPRESS if typed_only else default,
              "help": f.metadata.get("help", "").replace("%", "%%"), "dest": f.name}
        if f.name == "out_dir":
            kw.update(type=_out_dir, help=kw["help"] + " (the word none is refused, not taken as a folder name)")
        elif f.name == "regularizer":  # "none" is a regularizer choice (no regularizer), not None
            kw.update(type=str)
        elif "bool" in hint and "None" in hint:  # --flag alone means true; auto means None
            kw.update(type=_parse_bool_or_auto, metavar="BOOL|auto", nargs="?", const=True)
        elif "bool" in hint:  # --flag alone means true
            kw.update(type=_parse_bool, metavar="BOOL", nargs="?", const=True)
        elif "tuple" in hint:
            kw.update(type=float, nargs="*", metavar="FRACTION")
        elif "float" in hint:
            kw.update(type=_optional(float) if "None" in hint else float)
        elif "int" in hint:
            kw.update(type=_optional(_integer) if "None" in hint else _integer)
        else:
            kw.update(type=_optional(str) if "None" in hint else str)
        parser.add_argument(flag, **kw)


def add_config_file(parser: argparse.ArgumentParser) -> None:
    """The ``--config FILE`` option: Config fields from a YAML or JSON file, under the flags typed."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="YAML or JSON file of Config fields (a run's own config.json too); flags typed override it")


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default, except where there is none to show or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS) or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def build_parser(typed_only: bool = False) -> argparse.ArgumentParser:
    """The argument parser of every command. ``typed_only``: the Config flags' defaults are suppressed, so
    that parsing gives only the flags typed (see the module's docstring)."""
    from . import sweep

    parser = argparse.ArgumentParser(prog="python -m feddr_kit", allow_abbrev=False, description="feddr_kit: federated runs of FedDr+ and its baselines",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"examples:\n  {EXAMPLE}\n  {RESUME_EXAMPLE}\n  {SWEEP_EXAMPLE}\n  {SHOW_EXAMPLE}\n"
                                            f"  {FLOWER_EXAMPLE}\n\n'python -m feddr_kit run --help' lists every setting.")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    run = sub.add_parser("run", allow_abbrev=False, help="run one federated training and print its summary", formatter_class=_DefaultsFormatter,
                         description="Settings, later winning: the defaults below; with --resume, the run's own "
                                     "config.json; the --config file; the flags typed.")
    add_config_file(run)
    add_config_flags(run, typed_only=typed_only)
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out-dir from its checkpoint, with its own config.json; type only what "
                          "changes (rounds, lr, ...)")
    sweep.add_parser(sub)
    sweep_parser = sub.choices["sweep"]
    add_config_file(sweep_parser)
    add_config_flags(sweep_parser, skip=SWEEP_SET, typed_only=typed_only)
    flower = sub.add_parser("flower", allow_abbrev=False, help="run one federated training under Flower's `flwr run` simulation, "
                            "or on a running SuperLink and SuperNodes (needs pip install -e \".[flower]\")",
                            formatter_class=_DefaultsFormatter,
                            description="Writes the Flower App (pyproject.toml with the Config fields) and FLWR_HOME "
                                        "under --out-dir, starts a SuperLink there, runs `flwr run ... --stream`, stops "
                                        "the SuperLink and checks the result files. Needs Flower's simulation extra "
                                        "(Ray): pip install -e \".[flower]\". With --federation deployment it starts "
                                        "nothing: `flwr run` goes to the SuperLink at --superlink, whose SuperNodes (one "
                                        "per client) run the clients; run it on the SuperLink's machine, where the "
                                        "ServerApp writes --out-dir. Example: " + FLOWER_EXAMPLE)
    add_config_file(flower)
    add_config_flags(flower, skip=FLOWER_UNSUPPORTED, typed_only=typed_only)
    flower.add_argument("--federation", choices=("local", "deployment"), default="local",
                        help="local: a SuperLink of its own and Flower's simulation (Ray); deployment: the SuperLink at "
                             "--superlink and its SuperNodes, started beforehand")
    flower.add_argument("--superlink", metavar="HOST:PORT", default=None,
                        help="with --federation deployment: the SuperLink's address (no TLS: a closed network)")
    flower.add_argument("--num-supernodes", type=int, default=None, help="simulated SuperNodes (default: num_clients)")
    flower.add_argument("--startup-timeout", type=float, default=300.0,
                        help="seconds the SuperLink may take to start (local) or to answer (deployment)")
    flower.add_argument("--timeout", type=float, default=3600.0, help="seconds `flwr run` may take")
    flower.add_argument("--ray-num-cpus", type=_optional(int), default=1,
                        help="CPUs Ray may use, one ClientApp actor each (1: quickest Ray start-up); none: all cores")
    flower.add_argument("--ray-memory-threshold", type=_optional(float), default=0.98,
                        help="RAY_memory_usage_threshold (Ray counts other processes' memory too); none: Ray's default")
    show = sub.add_parser("show", allow_abbrev=False, help="print a run's summary and plot its history, or a sweep's interval table",
                          description="PATH a run folder: its summary, and its history drawn to PATH/history.png. PATH a "
                                      "sweep root: mean and 95 %% t interval over seeds per grid point. Files and "
                                      "columns: docs/outputs.md.")
    show.add_argument("path", metavar="PATH", help="a run folder (run --out-dir) or a sweep root (sweep --root)")
    show.add_argument("--csv", metavar="FILE", default=None, help="save a sweep's interval table to FILE")
    show.add_argument("--value", default="final_acc", help="for a sweep: the summary field tabulated (default: final_acc)")
    export = sub.add_parser("export", allow_abbrev=False, help="write a finished run's global weights (.pt or .safetensors) and a JSON to rebuild it",
                            description="Writes the reported global weights alone (torch.load(weights_only=True) reads a "
                                        ".pt) and FILE's .json twin: model, classes, normalization, Config. "
                                        "fk.load_model(FILE) rebuilds the model.")
    export.add_argument("run_dir", metavar="RUN_DIR", help="a finished run's folder")
    export.add_argument("--to", required=True, metavar="FILE", help="model.pt, or model.safetensors (needs pip install safetensors)")
    pers = sub.add_parser("personalize", allow_abbrev=False, help="fine-tune a finished run on every client (or train each alone) and save "
                          "per-client accuracies", formatter_class=_DefaultsFormatter,
                          description="finetune: every client fine-tunes the run's global model on its own data "
                                      "(fk.personalize.finetune); local-only: every client trains alone from the common "
                                      "initialization (fk.personalize.local_only). Writes per_client.csv and summary.json.")
    pers.add_argument("--run", required=True, metavar="RUN_DIR", help="a finished run's folder")
    pers.add_argument("--method", choices=METHODS, default="finetune", help="finetune or local-only")
    pers.add_argument("--epochs", type=float, default=None,
                      help="finetune: local epochs (default: 5); local-only: epochs (default: the run's expected local budget)")
    pers.add_argument("--lr", type=float, default=None, help="default: finetune the run's last lr; local-only the loss's default")
    pers.add_argument("--ft-algorithm", default=None, help="finetune: the method whose loss fine-tunes (default: the run's)")
    pers.add_argument("--loss", choices=("ce", "ce_etf", "dr"), default="ce", help="local-only: the local loss")
    pers.add_argument("--device", default="cpu", help="cpu or cuda")
    pers.add_argument("--out", default=None, metavar="DIR", help="where the files go (default: RUN_DIR/personalize-METHOD)")
    pers.add_argument("--no-progress", action="store_true", help="no progress display")
    return parser


def _plain_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def command_config(typed: dict, config_file: str | None, resume: bool = False) -> Config:
    """The Config of a command: the defaults, under the run's own ``config.json`` (``resume``), under the
    ``config_file``'s fields, under the ``typed`` flags (the Config fields among them). One-line
    :class:`FeddrKitError` for a file that cannot be read or a resume without its folder."""
    names = {f.name for f in fields(Config)}
    flags = {k: v for k, v in typed.items() if k in names}
    values = {**(read_file(config_file) if config_file else {}), **flags}
    if resume:
        if not values.get("out_dir"):
            raise FeddrKitError("--resume needs --out-dir (or out_dir in --config): the folder of the run to continue")
        saved = Path(values["out_dir"]) / "config.json"
        if not saved.is_file():
            raise FeddrKitError(f"--resume: {saved} does not exist; start the run without --resume first")
        values = {**read_mapping(saved, "the run's config"), **values}
    return Config.from_dict(values)


def summary_line(cfg: Config, summary: dict) -> str:
    """The one-line result of a run, as ``run`` and ``flower`` print it (accuracies in percent)."""
    return (f"{cfg.algorithm} on {cfg.dataset} ({cfg.partition}): final accuracy {summary['final_acc']:.2%}, "
            f"best {summary['best_acc']:.2%}, {summary['sec_per_round']:.1f} s per round")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 done, 1 the run diverged or a sweep run failed, 2 bad input,
    3 a result file could not be written, 130 interrupted by Ctrl-C)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    args = vars(parser.parse_args(argv))
    typed = vars(build_parser(typed_only=True).parse_args(argv))
    with warnings.catch_warnings():  # warnings as one plain sentence each, without a source line
        warnings.showwarning = _plain_warning
        try:
            return dispatch(args, typed)
        except KeyboardInterrupt:  # the run's folder is released on the way out; its last checkpoint is kept
            print("interrupted: the last checkpoint is kept and the folder released; the same command continues "
                  "(add --resume to a run)", file=sys.stderr)
            return 130


def dispatch(args: dict, typed: dict) -> int:
    """Run the parsed command (``args``: every option; ``typed``: only the flags typed); returns the exit code."""
    command = args["command"]
    if command == "show":
        from .show import main as show_main

        return show_main(args)
    if command == "export":
        from .export import main as export_main

        return export_main(args)
    if command == "personalize":
        from .personalize import main as personalize_main

        return personalize_main(args)
    names = {f.name for f in fields(Config)}
    try:
        if command == "sweep":  # the file and the flags make the sweep's base (see feddr_kit.sweep.main)
            base_file = read_file(args["config"]) if args["config"] else {}
            base_flags = {k: v for k, v in typed.items() if k in names}
        else:
            cfg = command_config(typed, args["config"], resume=args.get("resume", False))
    except FeddrKitError as err:
        return report(err)
    if command == "sweep":
        from .sweep import main as sweep_main

        return sweep_main({**args, "base_file": base_file, "base_flags": base_flags})
    if command == "flower":
        return flower_main(cfg, args)
    try:
        from .federated import run, schedule_note

        note = schedule_note(cfg)
        if note:
            print(note, file=sys.stderr)
        result = run(cfg, resume=args["resume"])
    except FeddrKitError as err:
        return report(err)
    print(json.dumps(result.summary, indent=2))
    print("\n" + summary_line(result.config, result.summary))
    if result.out_dir is not None:
        print(f"results in {result.out_dir}/ (config.json, history.csv, summary.json, checkpoint.pt; "
              f"python -m feddr_kit show {result.out_dir})")
    return 0


def flower_main(cfg: Config, args: dict) -> int:
    """``python -m feddr_kit flower``: :func:`feddr_kit.flower.simulate`, or with ``--federation deployment``
    :func:`feddr_kit.flower.deploy`; prints the summary and timings. What the mode needs (Flower, and Ray for
    the simulation) is checked first, so a missing one is one line, before anything starts."""
    from .flower import check_installed, check_superlink, deploy, simulate

    deployment = args["federation"] == "deployment"
    options = {k: args[k] for k in ("num_supernodes", "startup_timeout", "timeout", "ray_memory_threshold", "ray_num_cpus")}
    try:
        if deployment and args["superlink"] is None:
            raise FeddrKitError("--federation deployment needs --superlink HOST:PORT, the running SuperLink's address")
        if not deployment and args["superlink"] is not None:
            raise FeddrKitError("--superlink is for --federation deployment (the local simulation starts a SuperLink of its own)")
        if deployment:  # an address flwr run cannot use is refused at once, not after the start-up timeout
            check_superlink(args["superlink"])
        check_installed(simulation=not deployment)
        timing = (deploy(cfg, args["superlink"], startup_timeout=args["startup_timeout"], timeout=args["timeout"])
                  if deployment else simulate(cfg, **options))
    except FeddrKitError as err:
        return report(err)
    print(json.dumps(timing, indent=2))
    print("\n" + summary_line(cfg, timing["summary"]))
    print(f"flwr run finished in {timing['wall_s']:.1f} s; the first round began {timing['first_round_start_s']:.1f} s "
          f"after launch; results in {cfg.out_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
