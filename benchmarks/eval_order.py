"""How much the evaluation order moves a batch-statistics model's accuracy.

MobileNet's BatchNorm uses batch statistics at eval time. On data stored sorted by class (the
image-folder CIFAR-10), batches taken in stored order hold one class each. This script evaluates
the same MobileNet two ways: in stored (class-sorted) batches, as the kit once did, and
in the fixed seeded shuffle it uses now (``streams.eval_order``). It does this once at random init
and once after a short FedAvg run, and prints both accuracies and the share of predictions that
differ. The defaults are a CPU-sized slice of real CIFAR-10 (``--per-class-test 100`` test images
per class, a 400-per-class train subset, 3 rounds). Raise them on a GPU.

    python benchmarks/eval_order.py [--rounds 3] [--per-class-test 100] [--per-class-train 400]
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import torch

import feddr_kit as fk
from feddr_kit.algorithms import get_algorithm
from feddr_kit.federated import Evaluator, forward_all
from feddr_kit.models import build_model


def class_sorted_subset(data, per_class_train: int, per_class_test: int):
    """The first ``per_class_*`` images of every class, stored sorted by class (as the image folder is)."""
    def take(y, k):
        return torch.cat([torch.nonzero(y == c).flatten()[:k] for c in range(data.num_classes)])
    tr, te = take(data.train_y, per_class_train), take(data.test_y, per_class_test)
    return dataclasses.replace(data, train_x=data.train_x[tr], train_y=data.train_y[tr],
                               test_x=data.test_x[te], test_y=data.test_y[te])


def both_orders(model, algo, data, part, seed: int) -> dict:
    """Global accuracy in stored order and in the seeded shuffle, local accuracy both ways, and how many predictions differ."""
    _, z_stored = forward_all(model, algo, data, data.test_x)
    evaluator = Evaluator(data, part, seed)
    _, z_shuffled = forward_all(model, algo, data, data.test_x, evaluator.global_order())
    y = data.test_y
    stored_correct = (z_stored.argmax(1) == y).float()
    local_stored = np.mean([float(stored_correct[torch.from_numpy(t)].mean()) for t in part.test_indices])
    new = evaluator(model, algo)
    return {"acc_stored_order": float(stored_correct.mean()), "acc_seeded_shuffle": new["test_acc"],
            "local_acc_stored_order": local_stored, "local_acc_seeded_shuffle": new["local_test_acc"],
            "predictions_changed": float((z_stored.argmax(1) != z_shuffled.argmax(1)).float().mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-class-train", type=int, default=400)
    p.add_argument("--per-class-test", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    data = class_sorted_subset(fk.data.load("cifar10"), args.per_class_train, args.per_class_test)
    cfg = fk.Config(dataset="cifar10", model="mobilenet", algorithm="fedavg", partition="iid", num_clients=10,
                    clients_per_round=2, local_epochs=1, rounds=args.rounds, eval_every=args.rounds,
                    seed=args.seed, progress=False)
    part = fk.partition.iid(data.train_y, data.test_y, cfg.num_clients, seed=cfg.seed)
    algo = get_algorithm(cfg)
    torch.manual_seed(cfg.seed)
    init = build_model("mobilenet", data.num_classes, head_bias=algo.head_bias)
    algo.setup(init, cfg.seed)
    out = {"setting": {**vars(args), "test_images": len(data.test_y), "train_images": len(data.train_y)},
           "random_init": both_orders(init, algo, data, part, cfg.seed)}
    result = fk.run(cfg, data=data, partition=part)
    out[f"fedavg_after_{args.rounds}_rounds"] = both_orders(result.model, result.algorithm, data, part, cfg.seed)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
