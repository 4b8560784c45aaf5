"""Intervals over seeds or clients, and the verdicts the chapters print.

A comparison is a claim only with its interval and a margin::

    d = fk.stats.difference(acc_feddr, acc_dr, paired=True)       # same seeds: paired t
    fk.stats.verdict(d, expected="greater", margin=0.005)         # "held" | "tie (zero inside the interval)" | ...

The verdicts, for a claim "the difference is ``expected`` (greater / less than 0)" and a margin
``m ≥ 0`` (the smallest difference that counts). Read the interval ``[low, high]`` from the claim's
side: for "less", negate it, so that "in the claim's direction" is always "positive":

- **held**: the whole interval lies beyond ``+m`` in the claim's direction (``low > m``);
- **did not hold**: the whole interval lies beyond ``m`` on the other side (``high < -m``): the
  opposite effect is established, and it is at least as large as the margin;
- **against the claim (not shown beyond the margin)**: the interval lies wholly on the other side of
  zero but reaches into the margin (``-m <= high < 0``). The difference goes against the claim, and that
  is established, but it is not shown to be as large as the margin. The label names the direction and
  says nothing of the size, because the interval need not be small (``[-8.1, -0.3]`` pp against a 0.5 pp
  margin): called a tie, or "below the margin", it would read as "no difference" or "a small one", when
  the data point the other way and only a size beyond the margin is not shown;
- **in the claim's direction (not shown beyond the margin)**: the mirror case (``0 < low <= m``): the
  difference goes the claimed way, established, but is not shown to exceed the margin;
- **tie (zero inside the interval)**: the interval contains zero (``low <= 0 <= high``): not even the
  sign is known;
- **untestable here**: fewer than 2 values, a NaN anywhere, or the caller says the quantity is
  constant by construction (``testable=False``).

The two one-sided verdicts and the tie are all "no finding at this margin" (in the code, the three
ties: ``TIE_AGAINST``, ``TIE_TOWARD``, ``TIE``): :data:`TIES` holds them and :func:`is_tie` asks. With
``m = 0`` the one-sided ones cannot occur (an interval clear of zero is beyond the margin), and an
interval that touches zero (``low == 0``) has not excluded it: a tie.

The rule is symmetric: swapping ``a`` and ``b`` and the expected direction gives the same verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .errors import FeddrKitError


def _scipy_stats():
    """``scipy.stats``, imported at first use: the sweep imports this module, so ``import feddr_kit`` would
    otherwise need scipy, which a bare GPU machine (torch, torchvision, pandas) does not have."""
    from scipy import stats

    return stats


HELD, TIE, NOT_HELD, UNTESTABLE = "held", "tie (zero inside the interval)", "did not hold", "untestable here"
# the one-sided ties: the sign is established, the size is not; the words put the direction first
TIE_TOWARD = "in the claim's direction (not shown beyond the margin)"
TIE_AGAINST = "against the claim (not shown beyond the margin)"
# every verdict, from the claim's side over to the other side, then the untestable
VERDICTS = (HELD, TIE_TOWARD, TIE, TIE_AGAINST, NOT_HELD, UNTESTABLE)
TIES = (TIE_TOWARD, TIE, TIE_AGAINST)  # no finding at the margin
# who makes a claim: the paper; the course, testing a paper claim more strictly than the paper does (against the
# beta-scaled control, at one lr for both losses), so the paper has no number for it; or the chapter's own prediction
SOURCES = ("paper", "course test", "chapter hypothesis")
NO_VALUE = "—"  # what a table cell shows where there is no number, as the sweep's tables do for a missing run
DIRECTIONS = ("greater", "less")


@dataclass(frozen=True)
class Interval:
    """A mean and its confidence interval ``[low, high]`` from ``n`` values.

    ``n < 2`` gives ``low = -inf``, ``high = +inf`` (nothing can be said); a NaN among the values gives
    NaN everywhere. ``method`` says how it was made ("t", "paired t", "welch", "bootstrap BCa", …).
    """

    mean: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    method: str = "t"

    @property
    def half_width(self) -> float:
        """Half the width, ``(high - low) / 2`` (``inf`` when ``n < 2``; for asymmetric intervals, the mean half)."""
        return (self.high - self.low) / 2

    @property
    def testable(self) -> bool:
        """True when the interval is finite and made of at least 2 values."""
        return self.n >= 2 and all(math.isfinite(v) for v in (self.mean, self.low, self.high))

    def __neg__(self) -> "Interval":
        """The interval of the negated quantity (e.g. ``b - a`` from ``a - b``)."""
        return Interval(-self.mean, -self.high, -self.low, self.n, self.confidence, self.method)

    def format(self, fmt: str = ".3f", scale: float = 1.0, unit: str = "", sign: bool = False) -> str:
        """``"0.451 ± 0.012"`` for a symmetric interval, ``"0.451 [0.430, 0.470]"`` otherwise.

        ``scale`` multiplies every number (100 for percent), ``unit`` is appended ("%" or " pp"),
        ``sign`` forces a leading + on the mean (for differences). ``n < 2`` gives ``"0.451 (n=1)"``; a NaN
        mean (a NaN among the values, or no values at all) gives :data:`NO_VALUE`, the dash the tables print
        for a missing cell: ``"+nan"`` would read as a number.
        """
        if math.isnan(self.mean):
            return NO_VALUE
        spec = ("+" if sign else "") + fmt
        m = format(self.mean * scale, spec)
        if not self.testable:
            return f"{m}{unit} (n={self.n})"
        lo, hi = self.low * scale, self.high * scale
        centre = self.mean * scale
        if math.isclose(hi - centre, centre - lo, rel_tol=1e-6, abs_tol=1e-12):
            return f"{m} ± {format(self.half_width * scale, fmt)}{unit}"
        return f"{m} [{format(lo, fmt)}, {format(hi, fmt)}]{unit}"

    def __str__(self) -> str:
        return f"{self.format()} (n={self.n}, {self.confidence:.0%} {self.method})"


def _values(values: Iterable[float], name: str = "values") -> np.ndarray:
    try:
        x = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64)
    except (TypeError, ValueError):
        raise FeddrKitError(f"{name} must be a sequence of numbers, got {values!r}") from None
    if x.ndim != 1:
        raise FeddrKitError(f"{name} must be one-dimensional, got shape {x.shape}")
    if len(x) == 0:
        raise FeddrKitError(f"{name} must hold at least one number, got none")
    return x


def _check_confidence(confidence: float) -> None:
    if not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise FeddrKitError(f"confidence must be a number strictly between 0 and 1, got {confidence!r}")


def _untestable(mean: float, n: int, confidence: float, method: str) -> Interval:
    return Interval(float(mean), -math.inf, math.inf, n, confidence, method)


def interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Student-t interval of the mean of ``values`` (one per seed): ``mean ± t_{(1+c)/2, n-1} · s/√n``.

    ``values``: 1-D numbers, ``n = len(values)``; ``s`` is the sample standard deviation (ddof=1).
    Returns an :class:`Interval`; ``n = 1`` gives an infinite interval (untestable), a NaN a NaN one.
    """
    _check_confidence(confidence)
    x = _values(values)
    n, mean = len(x), float(x.mean())
    if n < 2:
        return _untestable(mean, n, confidence, "t")
    sem = float(x.std(ddof=1)) / math.sqrt(n)
    half = float(_scipy_stats().t.ppf((1 + confidence) / 2, n - 1)) * sem
    return Interval(mean, mean - half, mean + half, n, confidence, "t")


def bootstrap_interval(values: Iterable[float], confidence: float = 0.95, *, n_resamples: int = 9999,
                       method: str = "BCa", seed: int = 0) -> Interval:
    """Bootstrap interval of the mean of ``values`` (e.g. one per client), via ``scipy.stats.bootstrap``.

    Use it where seeds are too costly: resampling clients says how much the mean depends on which
    clients there are, not how much it depends on the training seed. ``method``: ``"BCa"``,
    ``"percentile"`` or ``"basic"``; ``seed`` makes it reproducible. For a paired comparison over
    the same clients pass ``a - b``. Constant values give a zero-width interval; ``n = 1`` an
    infinite one. Returns an :class:`Interval`.
    """
    _check_confidence(confidence)
    if method not in ("BCa", "percentile", "basic"):
        raise FeddrKitError(f"method must be one of BCa, percentile, basic, got {method!r}")
    x = _values(values)
    n, mean = len(x), float(x.mean())
    label = f"bootstrap {method}"
    if n < 2:
        return _untestable(mean, n, confidence, label)
    if not np.isfinite(x).all():
        return Interval(math.nan, math.nan, math.nan, n, confidence, label)
    if np.ptp(x) == 0:  # every resample has the same mean; BCa would divide by zero
        return Interval(mean, mean, mean, n, confidence, label)
    res = _scipy_stats().bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                        method=method, rng=np.random.default_rng(seed))
    return Interval(mean, float(res.confidence_interval.low), float(res.confidence_interval.high), n, confidence, label)


def difference(a: Sequence[float], b: Sequence[float], paired: bool = True, confidence: float = 0.95) -> Interval:
    """Interval of ``mean(a) - mean(b)``.

    ``paired=True`` (the same seeds, in the same order, on both sides): the t interval of the
    per-seed differences ``a[i] - b[i]`` (``scipy.stats.ttest_rel``'s interval), ``n`` = number of pairs.
    ``paired=False``: Welch's interval (``scipy.stats.ttest_ind(equal_var=False)``), which allows
    unequal sizes and variances; ``n`` = the smaller group's size. Returns an :class:`Interval`.
    """
    _check_confidence(confidence)
    x, y = _values(a, "a"), _values(b, "b")
    if paired:
        if len(x) != len(y):
            raise FeddrKitError(f"paired=True needs as many values in a as in b (one per seed), got {len(x)} and {len(y)}")
        d = interval(x - y, confidence)
        return Interval(d.mean, d.low, d.high, d.n, confidence, "paired t")
    n, mean = min(len(x), len(y)), float(x.mean() - y.mean())
    if n < 2:
        return _untestable(mean, n, confidence, "welch")
    if x.var(ddof=1) == 0 and y.var(ddof=1) == 0:  # both constant: Welch's df is 0/0
        return Interval(mean, mean, mean, n, confidence, "welch")
    ci = _scipy_stats().ttest_ind(x, y, equal_var=False).confidence_interval(confidence)
    return Interval(mean, float(ci.low), float(ci.high), n, confidence, "welch")


def verdict(diff: Interval, expected: str = "greater", margin: float = 0.0, testable: bool = True) -> str:
    """The verdict on "``diff`` is ``expected`` (greater / less than zero) by more than ``margin``".

    ``diff``: an :class:`Interval` of a difference (from :func:`difference`, or :func:`interval` /
    :func:`bootstrap_interval` of per-seed or per-client differences). Returns one of
    :data:`VERDICTS`; the rule, and what each of the three ties (:data:`TIES`) means, is in this module's docstring.
    ``testable=False`` marks a quantity that cannot differ by construction (e.g. both sides are the same
    model).
    """
    if expected not in DIRECTIONS:
        raise FeddrKitError(f"expected must be 'greater' or 'less', got {expected!r}")
    if not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
        raise FeddrKitError(f"margin must be a finite number >= 0, got {margin!r}")
    if not testable or not diff.testable:
        return UNTESTABLE
    low, high = (diff.low, diff.high) if expected == "greater" else (-diff.high, -diff.low)  # the claim's side is +
    if low > margin:
        return HELD
    if high < -margin:
        return NOT_HELD
    if high < 0:
        return TIE_AGAINST
    if low > 0:
        return TIE_TOWARD
    return TIE


def is_tie(v: str) -> bool:
    """True for each of the three ties (:data:`TIES`): the comparison found nothing at its margin."""
    return v in TIES


@dataclass
class Claim:
    """One row of a chapter's claims table.

    ``claim``: the sentence tested, e.g. "FedDr+ beats DR on final accuracy"; ``source``: one of :data:`SOURCES`:
    "paper" where the paper states the claim, "course test" where the course puts a claim of the paper to a
    comparison the paper does not make (e.g. against the β-scaled control), "chapter hypothesis" for the
    chapter's own prediction; ``setting``: where it was measured ("shard s=2, 20 rounds, cnn");
    ``diff``: the :class:`Interval` of the tested difference; ``expected``: "greater" / "less";
    ``margin``: the smallest difference that counts (same units as ``diff``); ``seeds``: what the
    interval runs over ("seeds 0-2", "10 clients"; default: ``n=<diff.n>``); ``testable=False``
    forces "untestable here"; ``scale`` / ``unit`` format the numbers (100 and " pp" for accuracies).
    """

    claim: str
    source: str
    setting: str
    diff: Interval
    expected: str = "greater"
    margin: float = 0.0
    seeds: str | int | None = None
    testable: bool = True
    scale: float = 1.0
    unit: str = ""
    fmt: str = ".3f"
    verdict: str = field(init=False)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise FeddrKitError(f"source must be one of {', '.join(map(repr, SOURCES))}, got {self.source!r}")
        if not isinstance(self.diff, Interval):
            raise FeddrKitError(f"diff must be a feddr_kit.stats.Interval, got {type(self.diff).__name__}")
        self.verdict = verdict(self.diff, self.expected, self.margin, self.testable)

    def row(self) -> dict[str, str]:
        """The claim as a table row of strings (columns as in :func:`claims_table`). A claim with no value (its
        interval's mean is NaN: nothing was measured) shows :data:`NO_VALUE` for both the value and the margin,
        since there is nothing for the margin to be compared with."""
        arrow = ">" if self.expected == "greater" else "<"
        bound = self.margin if self.expected == "greater" else -self.margin
        measured = not math.isnan(self.diff.mean)
        return {
            "claim": self.claim,
            "source": self.source,
            "setting": self.setting,
            "seeds": str(self.seeds) if self.seeds is not None else f"n={self.diff.n}",
            "value ± interval": self.diff.format(self.fmt, self.scale, self.unit, sign=True),
            "margin": f"{arrow} {format(bound * self.scale, '+' + self.fmt)}{self.unit}" if measured else NO_VALUE,
            "verdict": self.verdict,
        }


def claims_table(claims: Iterable[Claim]) -> pd.DataFrame:
    """A DataFrame with one row per :class:`Claim`, ready to display.

    Columns: claim, source, setting, seeds, value ± interval (the difference's mean and interval),
    margin (what the difference must exceed, with its direction), verdict.
    """
    rows = [c.row() for c in claims]
    return pd.DataFrame(rows, columns=["claim", "source", "setting", "seeds", "value ± interval", "margin", "verdict"])


def digest(table: pd.DataFrame) -> str:
    """A Markdown summary of a :func:`claims_table`: one bullet per verdict, the decided ones first (held,
    did not hold), then the three ties (against the claim first: they are the easiest to misread as "no
    difference"; then in the claim's direction; then zero inside the interval) and the untestable, each with one
    sub-bullet per claim giving its ``value ± interval`` (left out where the table has no value, :data:`NO_VALUE`)
    and setting. What a chapter's "what the table says" paragraph quotes, computed so that it always matches the
    table. Returns the Markdown text."""
    order = [HELD, NOT_HELD, TIE_AGAINST, TIE_TOWARD, TIE, UNTESTABLE]
    out = []
    for v in order:
        rows = table[table["verdict"] == v]
        if rows.empty:
            continue
        out.append(f"* **{v}** ({len(rows)} of {len(table)}):")
        out += [f"  * {r['claim']}" + (f": {r['value ± interval']}" if r["value ± interval"] != NO_VALUE else "")
                + f" ({r['setting']})" for _, r in rows.iterrows()]
    return "\n".join(out)
