"""Command line: ``python -m feddr_kit run [--field value ...]`` with every ``Config`` field as a flag,
and ``python -m feddr_kit sweep --grid grid.json --root DIR`` for a grid of runs (:mod:`feddr_kit.sweep`),
and ``python -m feddr_kit flower [--field value ...]`` for one run under Flower (:mod:`feddr_kit.flower`)."""
from __future__ import annotations

import argparse
import json
import sys
import typing
import warnings
from dataclasses import MISSING, fields

from .config import Config
from .errors import DivergedError, FeddrKitError, StorageError

EXAMPLE = "python -m feddr_kit run --dataset synthetic --rounds 4 --out-dir runs/try"
SWEEP_EXAMPLE = "python -m feddr_kit sweep --grid grid.json --root runs/grid"
FLOWER_EXAMPLE = ("python -m feddr_kit flower --dataset synthetic --num-clients 4 --clients-per-round 4 "
                  "--shards-per-client 5 --rounds 2 --out-dir runs/flower")


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _out_dir(text: str) -> str:
    if text.lower() == "none":
        raise argparse.ArgumentTypeError("'none' is not taken as a folder name: leave out --out-dir to save "
                                         "nothing, or write ./none for a folder called none")
    return text


def _optional(kind):
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)
    parse.__name__ = kind.__name__
    return parse


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--flag`` per ``Config`` field on ``parser`` (dest: the field name)."""
    hints = typing.get_type_hints(Config)
    for f in fields(Config):
        hint = str(hints[f.name])
        default = f.default if f.default is not MISSING else f.default_factory()
        flag = "--" + f.name.replace("_", "-")
        kw = {"default": default, "help": f.metadata.get("help", "").replace("%", "%%"), "dest": f.name}
        if f.name == "out_dir":
            kw.update(type=_out_dir, help=kw["help"] + " (the word none is refused, not taken as a folder name)")
        elif f.name == "regularizer":  # "none" is a regularizer choice (no regularizer), not None
            kw.update(type=str)
        elif "bool" in hint:  # --flag alone means true
            kw.update(type=_parse_bool, metavar="BOOL", nargs="?", const=True)
        elif "tuple" in hint:
            kw.update(type=float, nargs="+", metavar="FRACTION")
        elif "float" in hint:
            kw.update(type=_optional(float) if "None" in hint else float)
        elif "int" in hint:
            kw.update(type=_optional(int) if "None" in hint else int)
        else:
            kw.update(type=_optional(str) if "None" in hint else str)
        parser.add_argument(flag, **kw)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: subcommand ``run`` with one ``--flag`` per ``Config`` field."""
    parser = argparse.ArgumentParser(prog="python -m feddr_kit", allow_abbrev=False, description="feddr_kit: federated runs of FedDr+ and its baselines",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"examples:\n  {EXAMPLE}\n  {SWEEP_EXAMPLE}\n  {FLOWER_EXAMPLE}\n\n"
                                            "'python -m feddr_kit run --help' lists every setting.")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    run = sub.add_parser("run", help="run one federated training and print its summary", allow_abbrev=False,
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_config_flags(run)
    run.add_argument("--resume", action="store_true", help="continue from out_dir/checkpoint.pt (rounds and lr may change)")
    from . import sweep

    sweep.add_parser(sub)
    flower = sub.add_parser("flower", allow_abbrev=False, help="run one federated training under Flower's `flwr run` simulation "
                            "(needs pip install 'feddr_kit[flower]')", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                            description="Writes the Flower App (pyproject.toml with the Config fields) and FLWR_HOME "
                                        "under --out-dir, starts a SuperLink there, runs `flwr run ... --stream`, stops "
                                        "the SuperLink and checks the result files. Example: " + FLOWER_EXAMPLE)
    add_config_flags(flower)
    flower.add_argument("--num-supernodes", type=int, default=None, help="simulated SuperNodes (default: num_clients)")
    flower.add_argument("--startup-timeout", type=float, default=300.0, help="seconds the SuperLink may take to start")
    flower.add_argument("--timeout", type=float, default=3600.0, help="seconds `flwr run` may take")
    flower.add_argument("--ray-num-cpus", type=_optional(int), default=1,
                        help="CPUs Ray may use, one ClientApp actor each (1: quickest Ray start-up); none: all cores")
    flower.add_argument("--ray-memory-threshold", type=_optional(float), default=0.98,
                        help="RAY_memory_usage_threshold (Ray counts other processes' memory too); none: Ray's default")
    return parser


def _plain_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 done, 1 the run diverged, 2 bad input, 3 a result file
    could not be written, 130 interrupted by Ctrl-C)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    args = vars(parser.parse_args(argv))
    with warnings.catch_warnings():  # warnings as one plain sentence each, without a source line
        warnings.showwarning = _plain_warning
        try:
            if args["command"] == "sweep":
                from .sweep import main as sweep_main

                return sweep_main(args)
            if args["command"] == "flower":
                return flower_main(args)
            return run_main(args)
        except KeyboardInterrupt:  # the run's folder is released on the way out; its last checkpoint is kept
            print("interrupted: the last checkpoint is kept and the folder released; the same command continues "
                  "(add --resume to a run)", file=sys.stderr)
            return 130


def run_main(args: dict) -> int:
    """``python -m feddr_kit run``: :func:`feddr_kit.run`; prints the summary; returns the exit code."""
    args.pop("command")
    resume = args.pop("resume")
    try:
        from .federated import run, schedule_note

        cfg = Config.from_dict(args)
        note = schedule_note(cfg)
        if note:
            print(note, file=sys.stderr)
        result = run(cfg, resume=resume)
    except DivergedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except StorageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except FeddrKitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    s = result.summary
    print(json.dumps(s, indent=2))
    print(f"\n{cfg.algorithm} on {cfg.dataset} ({cfg.partition}): final accuracy {s['final_acc']:.2%}, "
          f"best {s['best_acc']:.2%}, {s['sec_per_round']:.1f} s per round")
    if result.out_dir is not None:
        print(f"results in {result.out_dir}/ (config.json, history.csv, summary.json, checkpoint.pt)")
    return 0


def flower_main(args: dict) -> int:
    """``python -m feddr_kit flower``: :func:`feddr_kit.flower.simulate`; prints the summary and timings."""
    args.pop("command")
    options = {k: args.pop(k) for k in ("num_supernodes", "startup_timeout", "timeout", "ray_memory_threshold", "ray_num_cpus")}
    try:
        from . import flower
    except ImportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        timing = flower.simulate(Config.from_dict(args), **options)
    except FeddrKitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(timing, indent=2))
    print(f"\nflwr run finished in {timing['wall_s']:.1f} s; the first round began {timing['first_round_start_s']:.1f} s "
          f"after launch; results in {args['out_dir']}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
