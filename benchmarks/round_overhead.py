"""Where a teaching round's time goes: model compute versus everything else.

Times ``fk.run`` at the teaching defaults, then the model compute alone: the same number of
forward/backward/optimizer steps (teacher forwards included for FedDr+) of the same model on
pre-made tensors of the same shapes — no gathering, augmentation, normalization, aggregation,
evaluation or probes. ``overhead = 1 - compute / round``. Times are this process's CPU seconds
(``time.process_time``), so other processes on the machine do not inflate them; run with
``OMP_NUM_THREADS=1`` so CPU time equals work. Each is the best of ``--repeats``.

    FEDDR_DATA_DIR=../shared/data OMP_NUM_THREADS=1 python benchmarks/round_overhead.py --algorithm feddr+ --rounds 10
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import feddr_kit as fk
from feddr_kit.algorithms import ClientContext, get_algorithm
from feddr_kit.federated import local_step, local_steps, make_partition, sample_clients


def time_run(cfg: fk.Config, data) -> float:
    """Mean CPU seconds per round of ``fk.run`` (evaluation and probes as configured)."""
    start = time.process_time()
    fk.run(cfg, data=data)
    return (time.process_time() - start) / cfg.rounds


def time_compute(cfg: fk.Config, data) -> float:
    """Mean CPU seconds per round of forward/backward/step alone, on fixed tensors, for the same steps."""
    part = make_partition(cfg, data)
    torch.manual_seed(cfg.seed)
    algo = get_algorithm(cfg)
    model = fk.models.build_model(cfg.model, data.num_classes, head_bias=algo.head_bias)
    algo.setup(model, cfg.seed)
    teacher = fk.models.build_model(cfg.model, data.num_classes, head_bias=algo.head_bias)
    algo.adapt_model(teacher)
    teacher.eval().requires_grad_(False)
    x = torch.randn(cfg.batch_size, *data.image_shape)
    y = torch.randint(0, data.num_classes, (cfg.batch_size,))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    mean_size = len(data.train_y) // cfg.num_clients
    start = time.process_time()
    for t in range(cfg.rounds):
        for k in sample_clients(cfg.seed, t, cfg.num_clients, cfg.clients_per_round):
            n = len(part.train_indices[k])
            ctx = ClientContext(client=int(k), round=t, lr=0.01, num_samples=n, num_steps=local_steps(n, cfg, mean_size),
                                class_counts=torch.ones(data.num_classes), global_state=state)
            params = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.SGD(params, lr=1e-4, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
            for _ in range(ctx.num_steps):
                local_step(model, teacher, algo, opt, x, y, ctx)
    return (time.process_time() - start) / cfg.rounds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", default="feddr+")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--probes", action="store_true")
    args = p.parse_args()
    data = fk.data.load("cifar10")
    cfg = fk.Config(algorithm=args.algorithm, rounds=args.rounds, probes=args.probes, progress=False)
    round_s = min(time_run(cfg, data) for _ in range(args.repeats))
    compute_s = min(time_compute(cfg, data) for _ in range(args.repeats))
    out = {"algorithm": args.algorithm, "probes": args.probes, "eval_every": cfg.eval_every,
           "round_cpu_s": round(round_s, 3), "compute_cpu_s": round(compute_s, 3),
           "overhead_share": round(1 - compute_s / round_s, 3), "threads": torch.get_num_threads()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
