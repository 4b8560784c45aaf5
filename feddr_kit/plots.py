"""Figures the notebooks share (seaborn/matplotlib).

Each function draws into ``ax`` (or ``axes`` for multi-panel figures; a new figure when None)
and returns the ``matplotlib.axes.Axes`` (an array of them for multi-panel figures). Every figure
has a title, labelled axes and a legend, so it reads without the code. ``use_style()`` sets the
fixed look the notebooks use. Observed classes are red and unobserved blue throughout, as in the
paper's figures. The 2-D computations behind chapters 01/02 live in :mod:`feddr_kit.teaching`.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch

from .errors import FeddrKitError


def partition_heatmap(partition, split: str = "train", ax=None, max_clients: int = 100,
                      title: str | None = None, class_names=None):
    """Heatmap of a ``Partition``'s samples per client (rows) and class (columns).

    Takes a ``feddr_kit.partition.Partition``, the split ("train" or "test") and shows the
    first ``max_clients`` clients; ``class_names`` (one per class, e.g. ``data.classes``) label the
    columns instead of the class indices. Returns the ``matplotlib.axes.Axes`` drawn into.
    """
    if not isinstance(max_clients, int) or isinstance(max_clients, bool) or max_clients < 1:
        raise FeddrKitError(f"max_clients: must be an integer >= 1, got {max_clients!r}")
    counts = partition.counts(split)[:max_clients]
    if class_names is not None and len(class_names) != counts.shape[1]:
        raise FeddrKitError(f"class_names: expected {counts.shape[1]} names (one per class), got {len(class_names)}")
    if ax is None:
        height = min(2.0 + 0.12 * counts.shape[0], 14.0)
        width = min(3.0 + 0.35 * counts.shape[1], 16.0)
        _, ax = plt.subplots(figsize=(width, height))
    small = counts.size <= 200  # annotate cells only when the numbers stay readable
    sns.heatmap(counts, ax=ax, cmap="viridis", annot=small, fmt="d",
                cbar_kws={"label": f"{split} samples"},
                xticklabels=list(class_names) if class_names is not None else _tick_step(counts.shape[1]),
                yticklabels=_tick_step(counts.shape[0]))
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


# =========================================================================== notebook figures
# Colours and styles shared by every chapter: observed classes red, unobserved blue (as in the
# paper's figures); one fixed line style / marker per run.
OBS_COLOR = "#d62728"
UNOBS_COLOR = "#1f77b4"
PULL_COLOR = "#2ca02c"
PUSH_COLOR = "#9467bd"
DR_COLOR = "#ff7f0e"
_CLASS_SETS = (("obs", OBS_COLOR, "observed"), ("unobs", UNOBS_COLOR, "unobserved"))  # probe column suffix, colour, name
_LINESTYLES = ["-", "--", ":", "-."]
_MARKERS = ["o", "s", "^", "D", "v", "P"]


def use_style() -> None:
    """The fixed look of every notebook figure: seaborn ``whitegrid``, notebook context, 100 dpi."""
    sns.set_theme(style="whitegrid", context="notebook", palette="deep")
    plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "figure.figsize": (6.4, 4.0),
                         "axes.titlesize": "medium", "legend.fontsize": "small",
                         "figure.constrained_layout.use": True})


def _axes(ax, ncols: int = 1, figsize=None, **kw):
    if ax is not None:
        return ax
    _, axes = plt.subplots(1, ncols, figsize=figsize, **kw)
    return axes


def _panel_row(axes, n: int, panel_size: tuple[float, float], suptitle: str | None):
    """``axes`` when given, else a new row of ``n`` panels of ``panel_size`` (width, height) each."""
    if axes is not None:
        return axes
    fig, axes = plt.subplots(1, n, figsize=(panel_size[0] * n, panel_size[1]), squeeze=False)
    if suptitle:
        fig.suptitle(suptitle)
    return axes[0]


def round_axis(ax) -> None:
    """Label ``ax``'s x axis as communication rounds, with whole-number ticks only (no round 12.5). Returns None."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("communication round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _zero_line(ax, quantity: str) -> None:
    """A grey line at 0 for the quantities whose sign matters (changes and differences)."""
    if quantity.endswith("_gap") or quantity == "feat_norm_diff":
        ax.axhline(0.0, color="grey", lw=0.8)


def accuracy_curves(histories: dict, metric: str = "test_acc", ax=None, title: str | None = None,
                    chance: float | None = None):
    """Accuracy over rounds of several runs: ``histories`` maps a label to a run's ``history``.

    ``metric``: a history column (``test_acc``: global model on the whole test set;
    ``local_test_acc``: mean over clients of the global model on each client's test set).
    ``chance`` (e.g. ``1 / num_classes``) draws the accuracy of guessing as a dotted line.
    Accuracies are shown in percent. Returns the Axes.
    """
    if not histories:
        raise FeddrKitError("histories: give at least one run")
    ax = _axes(ax)
    for i, (label, hist) in enumerate(histories.items()):
        if metric not in hist:
            raise FeddrKitError(f"metric: {metric!r} is not a column of the history of {label!r}")
        ax.plot(hist["round"], 100 * hist[metric], marker=_MARKERS[i % len(_MARKERS)], label=label)
    if chance is not None:
        ax.axhline(100 * chance, color="grey", ls=":", lw=1.2, label="chance")
    names = {"test_acc": "global test accuracy (%)", "local_test_acc": "mean local test accuracy (%)"}
    round_axis(ax)
    ax.set_ylabel(names.get(metric, metric))
    ax.set_title(title or f"{names.get(metric, metric)} of the global model over rounds")
    ax.legend(title="run")
    return ax


# --------------------------------------------------------------------------- chapter 01
def _draw_head(ax, V, highlight: int | None = None, scale: float = 1.0, labels=True) -> None:
    V = np.asarray(V, dtype=float)
    for c, v in enumerate(V):
        color = "black" if c == highlight else "grey"
        ax.annotate("", xy=scale * v, xytext=(0, 0),
                    arrowprops=dict(arrowstyle="-|>", color=color, lw=2.0 if c == highlight else 1.2))
        if labels:
            ax.text(*(scale * 1.15 * v), f"$v_{c}$" + (" (true)" if c == highlight else ""),
                    ha="center", va="center", fontsize="small", color=color)


def force_quiver(V, y: int = 0, extent: float = 2.0, n: int = 11, axes=None):
    """Three quiver panels of the forces on 2-D features of class ``y`` in front of a head ``V`` ``[C, 2]``.

    Left: the cross-entropy *pulling* force ``(1 - p_y) v_y``; middle: the *pushing* force
    ``-Σ_{c≠y} p_c v_c``; right: the dot-regression force (minus its gradient). All three panels
    share one arrow scale (the longest arrow of the figure spans one grid cell), so lengths compare
    across panels; the dotted circle is the unit circle, where the class vectors' tips lie (they
    are drawn longer, black/grey, for visibility). Returns the array of three Axes.
    """
    from . import teaching

    V = torch.as_tensor(V, dtype=torch.float64)
    if V.shape[1] != 2:
        raise FeddrKitError(f"V must be [C, 2] for a 2-D picture, got {tuple(V.shape)}")
    pts = teaching.feature_grid(extent, n)
    pts = pts[pts.norm(dim=1) > 1e-9]  # h = 0 has no direction: dot-regression is undefined there
    pull, push = teaching.ce_forces(pts, V, y)
    dr = teaching.dr_force(pts, V, y)
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(14, 4.8), sharex=True, sharey=True)
    panels = [(pull, PULL_COLOR, f"CE pulling force $(1-p_{y})\\,v_{y}$"),
              (push, PUSH_COLOR, f"CE pushing force $-\\sum_{{c\\neq {y}}} p_c v_c$"),
              (dr, DR_COLOR, f"dot-regression force $-\\nabla_h \\frac{{1}}{{2}}(\\cos(h, v_{y})-1)^2$")]
    longest = max(float(F_.norm(dim=1).max()) for F_, _, _ in panels)
    cell = 2 * extent / (n - 1)
    for ax, (F_, color, title) in zip(axes, panels):
        ax.quiver(pts[:, 0], pts[:, 1], F_[:, 0], F_[:, 1], color=color, angles="xy", pivot="tail", width=0.006,
                  scale_units="xy", scale=longest / cell)
        ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, ls=":", color="grey"))
        _draw_head(ax, V, highlight=y, scale=extent * 0.8)
        ax.set_aspect("equal")
        ax.set_xlim(-extent * 1.15, extent * 1.15)
        ax.set_ylim(-extent * 1.15, extent * 1.15)
        ax.set_title(title)
        ax.set_xlabel("feature $h_1$")
    axes[0].set_ylabel("feature $h_2$")
    return axes


def trajectory_plot(trajectories, V, y: int = 0, axes=None):
    """Gradient descent on one 2-D feature under CE and DR (from :func:`feddr_kit.teaching.descent_trajectory`).

    ``trajectories``: a DataFrame with a ``loss`` column (``ce`` / ``dr``) and the trajectory
    columns. Left: the paths in feature space, with the class vectors; middle: ``cos(h, v_y)``
    per step; right: the feature norm per step. Returns the array of three Axes.
    """
    V = np.asarray(V, dtype=float)
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    colors = {"ce": PUSH_COLOR, "dr": DR_COLOR}
    names = {"ce": "cross-entropy", "dr": "dot-regression"}
    reach = max(float(np.hypot(trajectories["h0"], trajectories["h1"]).max()), 1.0)
    _draw_head(axes[0], V, highlight=y, scale=reach * 0.9)
    for loss, t in trajectories.groupby("loss", sort=False):
        axes[0].plot(t["h0"], t["h1"], marker=".", color=colors[loss], label=names[loss])
        axes[0].plot(t["h0"].iloc[:1], t["h1"].iloc[:1], "k*", markersize=14, zorder=5)
        axes[1].plot(t["step"], t["cos_true"], color=colors[loss], label=f"{names[loss]}: cos to true class")
        axes[1].plot(t["step"], t["cos_other_max"], color=colors[loss], ls="--",
                     label=f"{names[loss]}: max cos to another class")
        axes[2].plot(t["step"], t["norm"], color=colors[loss], label=names[loss])
    axes[0].set_aspect("equal")
    axes[0].set_xlim(-reach * 1.2, reach * 1.2)
    axes[0].set_ylim(-reach * 1.2, reach * 1.2)
    axes[0].set_title("path of the feature (star: start)")
    axes[0].set_xlabel("feature $h_1$")
    axes[0].set_ylabel("feature $h_2$")
    axes[0].legend(loc="lower left", fontsize="x-small")
    axes[1].set_title(f"alignment with the true class $v_{y}$")
    axes[1].set_xlabel("gradient step")
    axes[1].set_ylabel("cosine")
    # below the panel: inside it, any corner covers one of the four curves for some start
    axes[1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize="x-small")
    axes[2].set_title("feature norm $\\|h\\|$")
    axes[2].set_xlabel("gradient step")
    axes[2].set_ylabel("norm")
    axes[2].legend()
    return axes


def force_explorer(angle_deg: float = 150.0, norm: float = 1.0, num_classes: int = 3, lr: float = 0.5,
                   y: int = 0, ax=None, magnify: bool = False):
    """One 2-D feature of class ``y`` and every force on it: the figure behind chapter 01's widget.

    The feature sits at ``angle_deg`` degrees with length ``norm`` in front of ``num_classes``
    unit class vectors evenly spaced on the circle (:func:`feddr_kit.teaching.circle_head`). Arrows
    from the feature: CE's pull, CE's push, their sum (CE's total force) and the dot-regression
    force, all drawn to the true scale of one step of size ``lr``; hollow markers show where one such
    step of CE and of DR takes the feature. Returns the Axes.

    ``magnify=True`` keeps the picture readable at any ``norm`` and ``lr``: the class vectors are drawn
    ``max(1, norm)`` long (the dotted circle then has that radius), and when the longest step is
    shorter than 0.45 of that, every arrow and both step markers are magnified by one common factor
    ``k`` (1, 2 or 5 times a power of ten, at most 1000), named in the title, so that their lengths still compare.
    """
    from . import teaching

    V = teaching.circle_head(int(num_classes))
    f = teaching.forces_at(angle_deg, norm, V, y=y, lr=lr)
    ax = _axes(ax, figsize=(6.2, 6.2))
    h = f["h"].numpy()
    radius, k = 1.0, 1.0
    if magnify:
        radius = max(1.0, float(norm))
        longest = max(float(lr * f[key].norm()) for key in ("ce_pull", "ce_push", "ce", "dr"))
        if 0 < longest < 0.45 * radius:
            k = _nice_floor(min(0.45 * radius / longest, 1000.0))  # capped: a force of ~0 stays a dot
    tips = [f[key].numpy() if k == 1 else h + k * (f[key].numpy() - h) for key in ("h_ce", "h_dr")]
    reach = max(1.3, 1.2 * radius, 1.2 * float(max(np.linalg.norm(h), *(np.linalg.norm(t) for t in tips))))
    ax.add_patch(plt.Circle((0, 0), radius, fill=False, ls=":", color="grey"))
    _draw_head(ax, V, highlight=y, scale=radius)
    times = "x lr" if k == 1 else f"x lr x {k:g}"
    for key, color, label in (("ce_pull", PULL_COLOR, "CE pull"), ("ce_push", PUSH_COLOR, "CE push"),
                              ("ce", "black", "CE total"), ("dr", DR_COLOR, "DR")):
        step = k * lr * f[key].numpy()
        ax.annotate("", xy=h + step, xytext=h, arrowprops=dict(arrowstyle="-|>", color=color, lw=2))
        ax.plot([], [], color=color, lw=2, label=f"{label} ({times})")
    ax.plot(*h, "k*", markersize=14, label="feature h")
    ax.plot(*tips[0], "o", mfc="none", mec="black", markersize=10, label="after one CE step" + ("" if k == 1 else f" (x {k:g})"))
    ax.plot(*tips[1], "o", mfc="none", mec=DR_COLOR, markersize=10, label="after one DR step" + ("" if k == 1 else f" (x {k:g})"))
    ax.set_xlim(-reach, reach)
    ax.set_ylim(-reach, reach)
    ax.set_aspect("equal")
    ax.set_xlabel("feature $h_1$")
    ax.set_ylabel("feature $h_2$")
    ax.set_title(f"C = {int(num_classes)}, |h| = {norm:g}, angle {angle_deg:g}°: $p_{y}$ = {f['p_y']:.2f}"
                 + ("" if k == 1 else f"; arrows x {k:g}"))
    if magnify:  # outside, where it hides no class vector
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="x-small")
    else:
        ax.legend(loc="lower left", fontsize="x-small")
    return ax


def _nice_floor(x: float) -> float:
    """The largest of 1, 2, 5 times a power of ten that is at most ``x`` (``x`` >= 1), e.g. 7.3 -> 5."""
    exp = 10.0 ** np.floor(np.log10(x))
    return float(max(m * exp for m in (1, 2, 5) if m * exp <= x))


# --------------------------------------------------------------------------- chapter 02
def head_vectors(V, ax=None, title: str | None = None):
    """Draw the rows of a head ``V`` ``[C, 2]`` or ``[C, 3]`` as arrows from the origin (3-D for d = 3).

    Returns the Axes (a 3-D Axes when ``d = 3``).
    """
    V = np.asarray(V, dtype=float)
    C, d = V.shape
    if d not in (2, 3):
        raise FeddrKitError(f"V must have 2 or 3 columns to be drawn, got {d}")
    if ax is None:
        fig = plt.figure(figsize=(4.8, 4.8))
        ax = fig.add_subplot(projection="3d" if d == 3 else None)
    colors = sns.color_palette("deep", C)
    if d == 2:
        for c, v in enumerate(V):
            ax.annotate("", xy=v, xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color=colors[c], lw=2))
            ax.text(*(1.15 * v), f"$v_{c}$", ha="center", va="center", color=colors[c])
        ax.add_patch(plt.Circle((0, 0), 1.0, fill=False, ls=":", color="grey"))
        ax.set_xlim(-1.3, 1.3)
        ax.set_ylim(-1.3, 1.3)
        ax.set_aspect("equal")
        ax.set_xlabel("dimension 1")
        ax.set_ylabel("dimension 2")
    else:
        for c, v in enumerate(V):
            ax.quiver(0, 0, 0, *v, color=colors[c], arrow_length_ratio=0.12, lw=2)
            ax.text(*(1.12 * v), f"$v_{c}$", color=colors[c])
        for i in range(C):  # edges of the simplex (a regular tetrahedron for C = 4)
            for j in range(i + 1, C):
                ax.plot(*zip(V[i], V[j]), color="grey", lw=0.8, ls=":")
        for axis in ("x", "y", "z"):
            getattr(ax, f"set_{axis}lim")(-1, 1)
            getattr(ax, f"set_{axis}ticks")([-1, 0, 1])
        ax.set_box_aspect((1, 1, 1))
        ax.set_xlabel("dim 1")
        ax.set_ylabel("dim 2")
        ax.set_zlabel("dim 3")
    ax.set_title(title or f"{C} class vectors in {d}-D")
    return ax


def gram_heatmap(G, ax=None, title: str | None = None, annotate: bool | None = None):
    """Heatmap of a Gram matrix ``V Vᵀ`` ``[C, C]`` (diagonal: squared norms; off-diagonal: inner products)."""
    G = np.asarray(G, dtype=float)
    ax = _axes(ax, figsize=(5.2, 4.4))
    annotate = G.shape[0] <= 6 if annotate is None else annotate
    sns.heatmap(G, ax=ax, cmap="RdBu_r", vmin=-1, vmax=1, center=0, square=True, annot=annotate, fmt=".2f",
                cbar_kws={"label": "$\\langle v_i, v_j \\rangle$"})
    ax.set_xlabel("class $j$")
    ax.set_ylabel("class $i$")
    ax.set_title(title or f"Gram matrix of {G.shape[0]} class vectors")
    return ax


def etf_gram(num_classes: int = 4, dim: int = 3, seed: int = 0, ax=None):
    """Build ``fk.heads.simplex_etf(num_classes, dim, seed)`` and draw its Gram matrix (the widget's figure).

    When no ETF exists (``dim < num_classes - 1``) the panel shows the kit's error message
    instead. Returns the Axes.
    """
    from . import heads, teaching

    try:
        V = heads.simplex_etf(int(num_classes), int(dim), seed)
    except FeddrKitError as err:
        ax = _axes(ax, figsize=(5.2, 4.4))
        ax.axis("off")
        ax.set_title(f"C = {num_classes}, d = {dim}: no simplex ETF")
        ax.text(0.5, 0.5, "\n".join(textwrap.wrap(f"FeddrKitError: {err}", 48)), ha="center", va="center",
                fontsize="small", color="#b00", transform=ax.transAxes)
        return ax
    C = int(num_classes)
    title = f"simplex ETF, C = {C}, d = {dim}\noff-diagonal $-1/(C-1)$ = {-1 / (C - 1):.3f}"
    return gram_heatmap(teaching.gram(V), ax=ax, title=title)


def head_grams(num_classes: int = 10, dim: int = 16, seed: int = 0, axes=None):
    """Gram matrices of a simplex ETF and of a random-init head side by side (chapter 02's widget).

    Both heads are ``[num_classes, dim]``, from ``fk.heads.simplex_etf`` and ``fk.heads.random_head``
    with ``seed``; the random head's rows are normalised first, so both panels show cosines. The
    ETF's panel does not change with ``dim`` (as long as ``dim >= C - 1``); the random head's
    off-diagonal cosines shrink like ``1/sqrt(dim)``. Returns the two Axes.
    """
    from . import heads, teaching

    C, d = int(num_classes), int(dim)
    axes = _panel_row(axes, 2, (5.2, 4.4), None)
    etf_gram(C, d, seed, ax=axes[0])
    R = torch.nn.functional.normalize(heads.random_head(C, d, seed).double(), dim=1)
    off = teaching.pairwise_cosines(R)
    gram_heatmap(teaching.gram(R), ax=axes[1],
                 title=f"random init, C = {C}, d = {d}\noff-diagonal cosines: std {off.std():.3f} (1/sqrt(d) = {d ** -0.5:.3f})")
    return axes


def cosine_distribution(table, ax=None, title: str | None = None):
    """Pairwise cosines between class vectors against the number of classes, per kind of head.

    ``table``: from :func:`feddr_kit.teaching.head_cosine_table` (columns ``head``, ``C``,
    ``cosine``). For each head, the line is the mean over all pairs and the band spans the
    smallest to the largest pairwise cosine; the x axis is logarithmic. Returns the Axes.
    """
    ax = _axes(ax, figsize=(10, 4.4))
    colors = sns.color_palette("deep", 3)
    for k, (name, t) in enumerate(table.groupby("head", sort=False)):
        g = t.groupby("C")["cosine"].agg(["mean", "min", "max"])
        ax.plot(g.index, g["mean"], marker=_MARKERS[k], color=colors[k], label=f"{name}: mean")
        if (g["max"] - g["min"]).max() > 1e-6:
            ax.fill_between(g.index, g["min"], g["max"], color=colors[k], alpha=0.2, label=f"{name}: min to max")
    ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    Cs = sorted(table["C"].unique())
    ax.set_xticks(Cs, [str(c) for c in Cs])
    ax.minorticks_off()
    ax.set_xlabel("number of classes $C$ (log scale)")
    ax.set_ylabel("cosine between two class vectors")
    ax.set_title(title or "Pairwise cosines of three frozen heads as the number of classes grows")
    ax.legend(title="head", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return ax


# --------------------------------------------------------------------------- chapters 03 / 04
_PROBE_LABELS = {
    "align": "alignment $\\cos(f(x), v_y)$",
    "acc": "local-model accuracy (%)",
    "align_gap": "alignment change: local $-$ global",
    "acc_gap": "accuracy change: local $-$ global (pp)",
    "feat_dist": "feature distance $\\|f_{local}-f_{global}\\|$",
    "feat_angle": "feature angle (degrees)",
    "feat_norm_diff": "norm difference $\\|f_{local}\\|-\\|f_{global}\\|$",
    "global_align": "global-model alignment",
    "global_acc": "global-model accuracy (%)",
    "global_feat_norm": "global feature norm $\\|f_{global}\\|$",
    "feat_dist_rel": "relative feature distance $\\|f_{local}-f_{global}\\| / \\|f_{global}\\|$",
}
# What a y axis says: the quantity in words (and its unit); the panel's title (_PROBE_LABELS) defines it. A norm
# formula or a "local − global", set on one line beside the axis, is taller than a panel in a row of three.
_PROBE_YLABELS = {
    **_PROBE_LABELS,
    "align_gap": "alignment change",
    "acc_gap": "accuracy change (pp)",
    "feat_dist": "feature distance",
    "feat_norm_diff": "norm difference",
    "global_feat_norm": "global feature norm",
    "feat_dist_rel": "relative feature distance",
}
_PERCENT = {"acc", "acc_gap", "global_acc"}


def observed_unobserved(histories: dict, quantity: str = "align", ax=None, title: str | None = None,
                        legend: bool = True, reference: float | None = None):
    """One probe quantity over rounds for several runs, observed (red) vs unobserved (blue) classes.

    ``histories`` maps a run label to a history recorded with ``probes=True``; ``quantity`` is
    one of ``align``, ``acc``, ``align_gap``, ``acc_gap`` (local minus the global model it started
    from), ``global_align``, ``global_acc`` (the global model the clients started from),
    ``feat_dist``, ``feat_dist_rel``, ``feat_angle``, ``feat_norm_diff``, ``global_feat_norm``. Line
    style and marker tell the runs apart. Each point is the mean over the round's sampled clients.
    ``legend=False`` leaves the legend to the caller (:func:`probe_panels` puts one under the panels);
    ``reference`` draws a dotted horizontal line there (e.g. ``-1/(C-1)`` for alignment). Returns the Axes.
    """
    from .teaching import with_gaps

    if quantity not in _PROBE_LABELS:
        raise FeddrKitError(f"quantity must be one of {', '.join(_PROBE_LABELS)}, got {quantity!r}")
    ax = _axes(ax)
    scale = 100.0 if quantity in _PERCENT else 1.0
    for i, (label, hist) in enumerate(histories.items()):
        h = with_gaps(hist)
        for s, color, name in _CLASS_SETS:
            ax.plot(h["round"], scale * h[f"{quantity}_{s}"], color=color, ls=_LINESTYLES[i % 4],
                    marker=_MARKERS[i % len(_MARKERS)], markersize=4, label=f"{label}, {name}")
    _zero_line(ax, quantity)
    if reference is not None:
        ax.axhline(scale * reference, color="black", ls=":", lw=1.0, label=f"{reference:+.3f}")
    round_axis(ax)
    ax.set_ylabel(_PROBE_YLABELS[quantity])
    ax.set_title(title or _PROBE_LABELS[quantity])
    if legend:
        ax.legend(fontsize="x-small")
    return ax


def probe_panels(histories: dict, quantities=("align", "acc"), axes=None, suptitle: str | None = None,
                 references: dict | None = None):
    """:func:`observed_unobserved` for several quantities side by side, with one legend below the
    panels (so that no line hides behind it). ``references``: quantity -> y of a dotted reference
    line. Returns the array of Axes."""
    axes = _panel_row(axes, len(quantities), (6.0, 4.2), suptitle)
    for ax, q in zip(axes, quantities):
        observed_unobserved(histories, q, ax=ax, legend=False, reference=(references or {}).get(q))
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].figure.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), fontsize="small")
    return axes


def client_drilldown(table, classes=None, axes=None, reference: float | None = None):
    """Per-class alignment of one client's probe images before (global model) and after its local round.

    ``table``: :func:`feddr_kit.teaching.client_classes`'s rows; one panel per loss (``run``). Grey
    bars: the global model; coloured bars: the local model, red for the client's observed classes,
    blue for the rest. ``classes``: class names for the ticks; ``reference``: a dotted line (e.g.
    ``-1/(C-1)``, the alignment of a feature that points exactly at another class's vector), always
    inside the panels' range. One legend below the panels. Returns the Axes.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    runs = list(dict.fromkeys(table["run"]))
    axes = _panel_row(axes, len(runs), (5.6, 3.8), None)
    low = min(table["global_align"].min(), table["align"].min(), 0.0, reference if reference is not None else 0.0)
    high = max(table["global_align"].max(), table["align"].max(), 0.0)
    pad = 0.08 * (high - low or 1.0)
    for ax, run in zip(axes, runs):
        t = table[table["run"] == run].sort_values("class")
        x = np.arange(len(t))
        colors = [OBS_COLOR if o else UNOBS_COLOR for o in t["observed"]]
        ax.bar(x - 0.2, t["global_align"], 0.4, color="lightgrey", edgecolor="grey")
        ax.bar(x + 0.2, t["align"], 0.4, color=colors)
        ax.axhline(0.0, color="grey", lw=0.8)
        if reference is not None:
            ax.axhline(reference, color="black", ls=":", lw=1.0)
        ax.set_ylim(low - pad, high + pad)  # the same range in every panel, the reference line included
        names = [classes[c] if classes is not None else str(c) for c in t["class"]]
        ax.set_xticks(x, [f"{n}*" if o else n for n, o in zip(names, t["observed"])], rotation=45, ha="right")
        ax.set_ylabel(_PROBE_YLABELS["align"])
        ax.set_title(f"{run}: unobs. acc {100 * t.loc[~t['observed'], 'global_acc'].mean():.0f}% -> "
                     f"{100 * t.loc[~t['observed'], 'acc'].mean():.0f}%")
    handles = [Patch(facecolor="lightgrey", edgecolor="grey", label="global model (before)"),
               Patch(color=OBS_COLOR, label="local model, the client's classes (*)"),
               Patch(color=UNOBS_COLOR, label="local model, other classes")]
    if reference is not None:
        handles.append(Line2D([], [], color="black", ls=":", label=f"{reference:+.3f}: pointing at another class"))
    axes[0].figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize="small")
    return axes


def probe_bars(table, quantity: str = "align", ax=None, title: str | None = None):
    """Bar chart of a :func:`feddr_kit.teaching.probe_table`: one group per run, observed vs unobserved."""
    ax = _axes(ax, figsize=(5.2, 3.8))
    scale = 100.0 if quantity in _PERCENT else 1.0
    x = np.arange(len(table.index))
    width = 0.38
    for k, (s, color, name) in enumerate(_CLASS_SETS):
        vals = scale * table[f"{quantity}_{s}"].to_numpy()
        bars = ax.bar(x + (k - 0.5) * width, vals, width, color=color, label=name)
        ax.bar_label(bars, fmt="%.2f" if scale == 1.0 else "%.1f", fontsize="x-small")
    ax.set_xticks(x, list(table.index))
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.margins(y=0.15)  # room for the bar labels
    ax.set_ylabel(_PROBE_YLABELS[quantity])
    ax.set_title(title or f"{_PROBE_LABELS[quantity]}, mean over rounds")
    ax.legend(title="classes", loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")  # beside, never over, the bars
    return ax


def probe_sweep(table, x: str = "beta", quantities=("feat_dist", "align", "acc"), axes=None,
                xlabel: str | None = None, suptitle: str | None = None):
    """Probe quantities against a swept setting, observed (red) vs unobserved (blue) classes.

    ``table``: one row per value of ``x`` with columns ``<quantity>_obs`` / ``<quantity>_unobs``
    (e.g. a :func:`feddr_kit.teaching.local_round_probes` result averaged per β). One panel per
    quantity. Returns the array of Axes.
    """
    axes = _panel_row(axes, len(quantities), (5.2, 3.9), suptitle)
    t = table.sort_values(x)
    for ax, q in zip(axes, quantities):
        scale = 100.0 if q in _PERCENT else 1.0
        for s, color, name in _CLASS_SETS:
            ax.plot(t[x], scale * t[f"{q}_{s}"], "o-", color=color, label=name)
        _zero_line(ax, q)
        ax.set_xlabel(xlabel or x)
        ax.set_ylabel(_PROBE_YLABELS.get(q, q))
        ax.set_title(_PROBE_LABELS.get(q, q))
        ax.legend(title="classes", fontsize="x-small")
    return axes


def force_vs_norm(table, ax=None, title: str | None = None):
    """The rotating force of CE and DR on a feature a fixed angle away from its class vector, vs its norm.

    ``table``: from :func:`feddr_kit.teaching.alignment_force_vs_norm`. Log scale: CE's force
    decays like ``1 - p_y`` (exponentially in the norm), DR's only like ``1/‖h‖``. Returns the Axes.
    """
    ax = _axes(ax, figsize=(6.4, 4.0))
    ax.semilogy(table["norm"], table["ce"].abs(), "o-", color=PUSH_COLOR, label="cross-entropy")
    ax.semilogy(table["norm"], table["dr"].abs(), "s-", color=DR_COLOR, label="dot-regression")
    offset = f"{table['offset_deg'].iloc[0]:g}°" if "offset_deg" in table else "a fixed angle"
    ax.set_xlabel(f"feature norm $\\|h\\|$ (direction fixed, {offset} from $v_y$)")
    ax.set_ylabel("force turning $h$ toward $v_y$ (log scale)")
    ax.set_title(title or "Once a feature is classified confidently, CE stops turning it; DR does not")
    ax.legend()
    return ax
