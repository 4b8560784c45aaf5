"""How far apart the serial and batched engines end after one round, in float32 and in float64.

Both engines compute the same round, but they sum in different orders (the batched engine runs the
round's clients as one vectorised model). In float32 that reorders rounding errors of about 1e-7, and
BatchNorm on batch statistics amplifies them: each normalisation divides by a batch's own standard
deviation, so a small change in one layer's outputs changes the next layer's statistics, step after
step. In float64 the same reordering stays near 1e-12, and tests/test_engine.py holds the engines to
1e-5 there. This script measures both on real data at the teaching scale: one round of ``fk.Config()``
(or ``--model``), both engines, each dtype; it prints, per dtype, the largest ``‖a − b‖ / ‖a‖`` over
the parameter tensors and both runs' test accuracy. Both engines run in one memory layout (NCHW by
default, ``--channels-last`` for NHWC): at the kit's auto layout the serial engine would run channels-last
on the CPU and the batched one NCHW, and the difference would mix the layouts' summation orders with the
engines'.

    FEDDR_DATA_DIR=../shared/data OMP_NUM_THREADS=1 python benchmarks/engine_float32.py            # cnn_bn, a few minutes
    FEDDR_DATA_DIR=../shared/data OMP_NUM_THREADS=1 python benchmarks/engine_float32.py --model cnn
"""
from __future__ import annotations

import argparse

import torch

import feddr_kit as fk


def worst_relative_difference(a: dict, b: dict) -> float:
    """max over floating-point tensors of ``‖a - b‖ / ‖a‖``."""
    return max(float((a[n].double() - b[n].double()).norm() / a[n].double().norm().clamp(min=1e-300))
               for n in a if a[n].is_floating_point())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=fk.Config().model)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--channels-last", action="store_true", help="both engines channels-last (NHWC); default both NCHW")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = fk.data.load("cifar10")
    cfg = fk.Config(model=args.model, rounds=1, eval_every=1, progress=False, device="cpu",
                    channels_last=args.channels_last)
    for name in args.dtypes:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, name))
        try:
            serial, batched = (fk.run(cfg, data=data, engine=e) for e in ("serial", "batched"))
        finally:
            torch.set_default_dtype(previous)
        worst = worst_relative_difference(serial.model.state_dict(), batched.model.state_dict())
        print(f"{args.model}, {name}: largest ‖serial − batched‖ / ‖serial‖ over the parameter tensors after one round "
              f"{worst:.1e}; test accuracy {serial.summary['final_acc']:.4f} (serial), {batched.summary['final_acc']:.4f} "
              "(batched)", flush=True)


if __name__ == "__main__":
    main()
