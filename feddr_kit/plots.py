"""Figures the notebooks share (seaborn/matplotlib). Each function draws into ``ax`` (a new
figure when ``ax`` is None) and returns the ``matplotlib.axes.Axes``."""

from __future__ import annotations

import matplotlib.pyplot as plt
import seaborn as sns

from .errors import FeddrKitError


def partition_heatmap(partition, split: str = "train", ax=None, max_clients: int = 100,
                      title: str | None = None):
    """Heatmap of a ``Partition``'s samples per client (rows) and class (columns).

    Takes a ``feddr_kit.partition.Partition``, the split ("train" or "test") and shows the
    first ``max_clients`` clients. Returns the ``matplotlib.axes.Axes`` drawn into.
    """
    if not isinstance(max_clients, int) or isinstance(max_clients, bool) or max_clients < 1:
        raise FeddrKitError(f"max_clients: must be an integer >= 1, got {max_clients!r}")
    counts = partition.counts(split)[:max_clients]
    if ax is None:
        height = min(2.0 + 0.12 * counts.shape[0], 14.0)
        width = min(3.0 + 0.35 * counts.shape[1], 16.0)
        _, ax = plt.subplots(figsize=(width, height))
    small = counts.size <= 200  # annotate cells only when the numbers stay readable
    sns.heatmap(counts, ax=ax, cmap="viridis", annot=small, fmt="d",
                cbar_kws={"label": f"{split} samples"},
                xticklabels=_tick_step(counts.shape[1]), yticklabels=_tick_step(counts.shape[0]))
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    if title is None:
        params = ", ".join(f"{k}={v}" for k, v in partition.params.items())
        shown = "" if counts.shape[0] == partition.num_clients else \
            f" (first {counts.shape[0]} of {partition.num_clients} clients)"
        title = f"{partition.kind} partition: {params} — {split}{shown}"
    ax.set_title(title)
    return ax


def _tick_step(n: int) -> int | bool:
    """Label every tick for small axes, else about 20 evenly spaced ones."""
    return True if n <= 25 else max(n // 20, 1)
