"""feddr_kit.stats: intervals against hand computations, and the verdict rule."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feddr_kit import stats
from feddr_kit.errors import FeddrKitError
from feddr_kit.stats import HELD, NOT_HELD, TIE, TIE_AGAINST, TIE_TOWARD, UNTESTABLE, Claim, Interval

# Student-t quantiles from a printed table (two-sided 95 % → t_{0.975}, 90 % → t_{0.95}).
T975 = {2: 4.302653, 4: 2.776445, 9: 2.262157}
T95 = {4: 2.131847}

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
samples = st.lists(finite, min_size=2, max_size=12)


def test_t_interval_matches_hand_computation():
    x = [2.0, 4.0, 4.0, 5.0, 7.0]  # mean 4.4, s^2 = (5.76+0.16+0.16+0.36+6.76)/4 = 3.3
    iv = stats.interval(x)
    half = T975[4] * math.sqrt(3.3 / 5)
    assert iv.mean == pytest.approx(4.4)
    assert (iv.low, iv.high) == pytest.approx((4.4 - half, 4.4 + half), rel=1e-6)
    assert iv.n == 5 and iv.half_width == pytest.approx(half, rel=1e-6)
    iv90 = stats.interval(x, confidence=0.90)
    assert iv90.half_width == pytest.approx(T95[4] * math.sqrt(3.3 / 5), rel=1e-6)


def test_three_seeds_hand_computation():
    iv = stats.interval([0.40, 0.42, 0.47])  # mean 0.43, s = sqrt((0.0009+0.0001+0.0016)/2) = sqrt(0.0013)
    assert iv.half_width == pytest.approx(T975[2] * math.sqrt(0.0013 / 3), rel=1e-6)


def test_one_value_is_untestable():
    iv = stats.interval([0.5])
    assert iv.mean == 0.5 and iv.low == -math.inf and iv.high == math.inf and not iv.testable
    for expected in ("greater", "less"):
        assert stats.verdict(iv, expected) == UNTESTABLE
    assert stats.verdict(stats.difference([0.5], [0.3]), "greater") == UNTESTABLE
    assert stats.verdict(stats.difference([0.5], [0.3, 0.4], paired=False)) == UNTESTABLE
    assert iv.format() == "0.500 (n=1)"


def test_nan_and_caller_untestable():
    assert stats.verdict(stats.interval([0.1, float("nan"), 0.3])) == UNTESTABLE
    clear = stats.interval([1.0, 1.1, 1.2])
    assert stats.verdict(clear, "greater") == HELD
    assert stats.verdict(clear, "greater", testable=False) == UNTESTABLE


def test_verdicts_on_constructed_intervals():
    def iv(lo, hi):
        return Interval((lo + hi) / 2, lo, hi, 3)

    assert stats.verdict(iv(0.02, 0.05), "greater", margin=0.01) == HELD
    assert stats.verdict(iv(0.005, 0.05), "greater", margin=0.01) == TIE_TOWARD  # positive, but reaches into the margin
    assert stats.verdict(iv(-0.005, 0.005), "greater", margin=0.01) == TIE   # inside the margin, sign unknown
    assert stats.verdict(iv(-0.05, 0.05), "greater") == TIE
    assert stats.verdict(iv(-0.05, -0.02), "greater", margin=0.01) == NOT_HELD
    assert stats.verdict(iv(-0.05, -0.005), "greater", margin=0.01) == TIE_AGAINST  # negative, not beyond -m
    assert stats.verdict(iv(-0.05, -0.02), "less", margin=0.01) == HELD
    assert stats.verdict(iv(0.02, 0.05), "less", margin=0.01) == NOT_HELD
    assert stats.verdict(iv(0.0, 0.05), "greater") == TIE  # touching zero is not beyond it
    assert stats.verdict(iv(0.0, 0.05), "greater", margin=0.01) == TIE  # nor with a margin


def test_one_sided_ties_at_their_boundaries():
    """The two one-sided ties: the sign is established, the size is not. Their edges: the interval's end
    at zero (a plain tie) and at the margin (a one-sided tie, as "beyond the margin" is strict)."""
    def iv(lo, hi):
        return Interval((lo + hi) / 2, lo, hi, 3)

    m = 0.01
    # the interval excludes zero against the claim, and stays within the margin: chapter 05's s = 2
    # FedDr+ - FedAvg had this shape, and "tie" alone read as "no difference"
    assert stats.verdict(iv(-0.081, -0.003), "greater", margin=m) == TIE_AGAINST
    assert stats.verdict(iv(0.003, 0.081), "less", margin=m) == TIE_AGAINST  # the same, seen from "less"
    assert stats.verdict(iv(-0.081, -m), "greater", margin=m) == TIE_AGAINST  # at -m: not beyond it
    assert stats.verdict(iv(-0.081, 0.0), "greater", margin=m) == TIE  # reaching zero: sign unknown
    assert stats.verdict(iv(m, 0.081), "greater", margin=m) == TIE_TOWARD
    assert stats.verdict(iv(-0.081, -0.003), "less", margin=m) == TIE_TOWARD
    for v in (TIE, TIE_TOWARD, TIE_AGAINST):
        assert stats.is_tie(v)
    for v in (HELD, NOT_HELD, UNTESTABLE):
        assert not stats.is_tie(v)
    assert set(stats.TIES) < set(stats.VERDICTS) and len(set(stats.VERDICTS)) == len(stats.VERDICTS) == 6


def test_labels_say_where_zero_and_the_margin_lie():
    """What a reader sees is the label alone, so it says what the rule found: a one-sided verdict names its
    direction and that the margin was not shown (an interval such as [-8.1, -0.3] pp is not "small", and not
    "no difference"), and the tie says that zero lies inside the interval."""
    assert TIE == "tie (zero inside the interval)"
    assert TIE_AGAINST == "against the claim (not shown beyond the margin)"
    assert TIE_TOWARD == "in the claim's direction (not shown beyond the margin)"
    for v in (TIE_AGAINST, TIE_TOWARD):
        assert "tie" not in v and "below the margin" not in v


@settings(max_examples=200, deadline=None)
@given(finite, st.floats(0, 100), st.floats(0, 5), st.sampled_from(["greater", "less"]))
def test_without_a_margin_no_one_sided_tie(centre, width, margin, expected):
    """With margin 0 an interval clear of zero is beyond the margin: only held / did not hold / a plain tie.
    With any margin, a one-sided tie has its whole interval on one side of zero and reaching into the margin."""
    d = Interval(centre, centre - width, centre + width, 3)
    assert stats.verdict(d, expected, 0.0) in (HELD, NOT_HELD, TIE)
    v = stats.verdict(d, expected, margin)
    sign = 1 if expected == "greater" else -1
    low, high = sorted((sign * d.low, sign * d.high))
    if v == TIE_AGAINST:
        assert -margin <= high < 0
    elif v == TIE_TOWARD:
        assert 0 < low <= margin
    elif v == TIE:
        assert low <= 0 <= high


def test_paired_uses_the_per_seed_differences():
    a = np.array([0.50, 0.61, 0.45, 0.70])
    b = a - np.array([0.010, 0.012, 0.009, 0.011])  # tiny but consistent gain, large between-seed spread
    d = np.array([0.010, 0.012, 0.009, 0.011])  # mean 0.0105, s^2 = (0.25+2.25+2.25+0.25)e-6/3
    paired = stats.difference(a, b, paired=True)
    half = 3.182446 * math.sqrt(5e-6 / 3 / 4)  # t_{0.975, 3}
    assert paired.mean == pytest.approx(d.mean())
    assert (paired.low, paired.high) == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-5)
    assert stats.verdict(paired, "greater") == HELD
    unpaired = stats.difference(a, b, paired=False)
    assert unpaired.mean == pytest.approx(d.mean())
    assert stats.verdict(unpaired, "greater") == TIE  # the seed-to-seed spread swamps it without pairing


def test_welch_matches_hand_computation():
    a, b = [1.0, 2.0, 3.0], [2.0, 4.0, 7.0]
    va, vb = 1.0, 19.0 / 3  # sample variances
    se2 = va / 3 + vb / 3
    df = se2**2 / ((va / 3) ** 2 / 2 + (vb / 3) ** 2 / 2)
    from scipy.special import stdtrit  # the t quantile, computed apart from scipy.stats
    half = stdtrit(df, 0.975) * math.sqrt(se2)
    d = stats.difference(a, b, paired=False)
    assert d.mean == pytest.approx(2.0 - 13.0 / 3)
    assert (d.low, d.high) == pytest.approx((d.mean - half, d.mean + half), rel=1e-6)
    assert d.n == 3


def test_paired_needs_equal_lengths_and_bad_input_is_one_line():
    with pytest.raises(FeddrKitError, match="paired=True"):
        stats.difference([1, 2, 3], [1, 2])
    with pytest.raises(FeddrKitError, match="confidence"):
        stats.interval([1, 2], confidence=95)
    with pytest.raises(FeddrKitError, match="expected"):
        stats.verdict(stats.interval([1, 2]), "bigger")
    with pytest.raises(FeddrKitError, match="margin"):
        stats.verdict(stats.interval([1, 2]), margin=-0.1)
    with pytest.raises(FeddrKitError, match="values"):
        stats.interval([])


@settings(max_examples=60, deadline=None)
@given(samples, finite)
def test_shifting_the_data_shifts_the_interval(x, c):
    iv, shifted = stats.interval(x), stats.interval([v + c for v in x])
    assert shifted.mean == pytest.approx(iv.mean + c, abs=1e-6)
    assert shifted.low == pytest.approx(iv.low + c, abs=1e-6)
    assert shifted.high == pytest.approx(iv.high + c, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(samples, samples, st.floats(0, 5), st.sampled_from(["greater", "less"]), st.booleans())
def test_verdict_symmetric_under_swap(a, b, margin, expected, paired):
    if paired:
        b = (b * len(a))[: len(a)]
    other = "less" if expected == "greater" else "greater"
    forward = stats.verdict(stats.difference(a, b, paired=paired), expected, margin)
    backward = stats.verdict(stats.difference(b, a, paired=paired), other, margin)
    assert forward == backward


@settings(max_examples=40, deadline=None)
@given(samples, st.floats(0.5, 0.99))
def test_interval_contains_mean_and_widens_with_confidence(x, c):
    iv, wider = stats.interval(x, c), stats.interval(x, min(c + 0.005, 0.995))
    assert iv.low <= iv.mean <= iv.high
    assert wider.low <= iv.low + 1e-9 and wider.high >= iv.high - 1e-9


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    rng = np.random.default_rng(0)
    x = rng.normal(0.3, 0.1, size=40)
    one = stats.bootstrap_interval(x, seed=1, n_resamples=2000)
    again = stats.bootstrap_interval(x, seed=1, n_resamples=2000)
    assert one == again
    assert one.low < x.mean() < one.high
    # about as wide as the t interval for near-normal data
    assert one.half_width == pytest.approx(stats.interval(x).half_width, rel=0.25)
    assert stats.bootstrap_interval([0.2, 0.2, 0.2]).half_width == 0
    assert not stats.bootstrap_interval([0.2]).testable


def test_claims_table_formats_rows():
    d = stats.difference([0.45, 0.47, 0.46], [0.40, 0.41, 0.43])
    rows = [
        Claim("FedDr+ beats DR", "paper", "shard s=2", d, margin=0.005, seeds="0,1,2", scale=100, unit=" pp", fmt=".1f"),
        Claim("DR beats FedDr+", "chapter hypothesis", "shard s=2", -d, margin=0.005),
        Claim("same model", "chapter hypothesis", "shard s=2", d, testable=False),
        Claim("FedDr+ beats the control", "course test", "shard s=2", d),
    ]
    table = stats.claims_table(rows)
    assert list(table.columns) == ["claim", "source", "setting", "seeds", "value ± interval", "margin", "verdict"]
    assert list(table["verdict"]) == [HELD, NOT_HELD, UNTESTABLE, HELD]
    assert list(table["source"]) == ["paper", "chapter hypothesis", "chapter hypothesis", "course test"]
    assert table.loc[0, "value ± interval"].startswith("+4.7 ± ")
    assert table.loc[0, "value ± interval"].endswith(" pp")
    assert table.loc[0, "margin"] == "> +0.5 pp"
    assert table.loc[1, "seeds"] == "n=3"
    with pytest.raises(FeddrKitError, match="'paper', 'course test', 'chapter hypothesis', got 'blog'"):
        Claim("x", "blog", "s", d)


def test_digest_leads_with_decided_verdicts_and_quotes_every_claim():
    from feddr_kit.stats import Claim, claims_table, digest, interval

    rows = [Claim("a tie", "paper", "s", interval([-1.0, 2.0, 3.0]), "greater", 0.1),
            Claim("a win", "paper", "s", interval([1.0, 1.1, 1.2]), "greater", 0.1),
            Claim("a small loss", "paper", "s", interval([-0.3, -0.31, -0.32]), "greater", 0.5),
            Claim("a loss", "paper", "s", interval([-1.0, -1.1, -1.2]), "greater", 0.1)]
    text = digest(claims_table(rows))
    heads = [line for line in text.splitlines() if line.startswith("* ")]
    assert [line.split("**")[1] for line in heads] == [HELD, NOT_HELD, TIE_AGAINST, TIE]
    lines = text.splitlines()
    assert "(1 of 4)" in lines[0] and lines[1].startswith("  * a win: +1.100") and lines[5].startswith("  * a small loss: ")
    assert lines[7].startswith("  * a tie: ")


def test_a_claim_with_no_value_shows_a_dash_not_nan():
    """A NaN interval (nothing measured, or a NaN among the values) prints the tables' dash; its claim row
    has no margin to compare with and its digest bullet quotes no value."""
    nothing = stats.interval([float("nan")])
    assert nothing.format() == stats.NO_VALUE == "—" and nothing.format(".2f", 100, " pp", sign=True) == "—"
    assert stats.interval([0.1, float("nan"), 0.3]).format() == "—"
    assert Interval(math.nan, -math.inf, math.inf, 0).format(sign=True) == "—"
    assert stats.interval([0.5]).format(sign=True) == "+0.500 (n=1)"  # one seed still shows its value
    rows = [Claim("not run here", "paper", "needs other runs", nothing, testable=False, seeds="—"),
            Claim("no common seed", "paper", "s", Interval(math.nan, -math.inf, math.inf, 0), margin=0.005, scale=100,
                  unit=" pp", fmt=".1f"),
            Claim("same model", "paper", "s", stats.interval([0.0, 0.0, 0.0]), margin=0.005, testable=False)]
    table = stats.claims_table(rows)
    assert list(table["verdict"]) == [UNTESTABLE] * 3
    assert list(table["value ± interval"]) == ["—", "—", "+0.000 ± 0.000"]
    assert list(table["margin"]) == ["—", "—", "> +0.005"]  # a measured untestable claim keeps its margin
    assert not table.apply(lambda col: col.str.contains("nan")).any().any()
    text = stats.digest(table)
    assert "  * not run here (needs other runs)" in text.splitlines() and "  * no common seed (s)" in text.splitlines()
    assert "  * same model: +0.000 ± 0.000 (s)" in text.splitlines() and "nan" not in text and "—" not in text
