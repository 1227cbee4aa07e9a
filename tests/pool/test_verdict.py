"""The gate's verdicts (zenedge.pool.verdict): pure arithmetic, checked as properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zenedge.pool.verdict import GAIN_EPS, MIN_EXAMPLES, retention, verdict


def sets(min_size=1, max_size=64):
    """Per-example (base, own, merged) summed losses and answer-token counts of one eval set."""
    example = st.tuples(st.floats(0.5, 60.0), st.floats(0.0, 60.0), st.floats(0.0, 80.0), st.integers(1, 40))
    return st.lists(example, min_size=min_size, max_size=max_size).map(lambda rows: tuple(map(list, zip(*rows))))


@settings(max_examples=300, deadline=None)
@given(sets(), st.floats(0.0, 1.0))
def test_reading_the_whole_set_is_the_retention_rule(data, threshold):
    base, own, merged, tokens = data
    count = sum(tokens)
    result = verdict(base, own, merged, tokens, threshold, population=len(merged))
    expected = retention(sum(base) / count, sum(own) / count, sum(merged) / count)
    assert result.decided and result.examples == len(merged)
    assert result.retention == pytest.approx(expected)
    if abs(expected - threshold) > 1e-9:  # away from the float tie, the rule is exactly retention >= T
        assert result.passed == (expected >= threshold)


@settings(max_examples=200, deadline=None)
@given(sets(max_size=MIN_EXAMPLES - 1), st.floats(0.0, 1.0))
def test_no_verdict_before_min_examples_unless_the_set_is_that_small(data, threshold):
    base, own, merged, tokens = data
    assert not verdict(base, own, merged, tokens, threshold, population=64).decided


@settings(max_examples=200, deadline=None)
@given(sets(min_size=MIN_EXAMPLES, max_size=40), st.floats(0.05, 0.95), st.floats(0.0, 0.5))
def test_a_better_merge_never_turns_a_pass_into_a_fail(data, threshold, improvement):
    base, own, merged, tokens = data
    before = verdict(base, own, merged, tokens, threshold, population=64)
    better = [m * (1 - improvement) for m in merged]
    after = verdict(base, own, better, tokens, threshold, population=64)
    if before.decided and before.passed:
        assert not (after.decided and not after.passed)


def test_clear_cases_stop_at_min_examples():
    n = MIN_EXAMPLES
    tokens = [10] * n
    base = [30.0 + (i % 3) for i in range(n)]
    own = [b - 10.0 for b in base]
    kept = verdict(base, own, [o + 0.5 for o in own], tokens, 0.7, population=64)     # keeps ~95 %
    lost = verdict(base, own, [b - 1.0 for b in base], tokens, 0.7, population=64)    # keeps ~10 %
    assert kept.decided and kept.passed and kept.examples == n
    assert lost.decided and not lost.passed


def test_a_borderline_merge_reads_on():
    n = MIN_EXAMPLES
    tokens = [10] * n
    base = [30.0] * n
    own = [20.0] * n
    merged = [23.0 + (1.5 if i % 2 else -1.5) for i in range(n)]  # retention 0.7 on average, noisy
    assert not verdict(base, own, merged, tokens, 0.7, population=64).decided


def test_an_adapter_without_gain_only_asks_that_merging_not_hurt():
    tokens = [10] * 20
    base = [30.0] * 20
    own = [30.0] * 20                      # never helped on its own set
    assert verdict(base, own, [30.0] * 20, tokens, 0.9, 20).passed
    assert not verdict(base, own, [30.0 + 20 * GAIN_EPS * 10] * 20, tokens, 0.9, 20).passed


def test_a_merge_on_the_threshold_is_decided_once_retention_is_known_closely():
    n = 32
    tokens = [10] * n
    base = [30.0] * n
    own = [20.0] * n
    merged = [23.0 + (0.1 if i % 2 else -0.1) for i in range(n)]   # retention 0.70 ± 0.01: on the line
    result = verdict(base, own, merged, tokens, 0.7, population=64)
    assert result.decided and result.retention == pytest.approx(0.7)


def test_retention_formula():
    assert retention(3.0, 2.0, 2.0) == 1.0
    assert retention(3.0, 2.0, 2.5) == 0.5
    assert retention(3.0, 2.0, 3.5) == -0.5
    assert retention(3.0, 3.0, 3.0) == 1.0      # no gain to keep: fine if not worse
    assert retention(3.0, 3.0, 3.6) == 0.0


def test_a_near_deterministic_member_passes_on_answers_kept_right():
    """Own adapter at ~0 loss and every answer token right: a merge at 0.2 nats per token that
    still gets every token right keeps only ~60 % of the likelihood gain, but all of the accuracy."""
    from zenedge.pool.verdict import accuracy_verdict, verdict_of

    n, tokens = 16, [5] * 16
    base, own, merged = [2.5] * n, [0.01] * n, [1.0] * n          # summed losses: 0.5 / 0.002 / 0.2 per token
    base_hits, own_hits, merged_hits = [1] * n, [5] * n, [5] * n
    loss = verdict(base, own, merged, tokens, 0.7, 64)
    accuracy = accuracy_verdict(base_hits, own_hits, merged_hits, tokens, 0.7, 64)
    assert not loss.passed and accuracy.decided and accuracy.passed
    kept, metric = verdict_of(loss, accuracy)
    assert kept.decided and kept.passed and metric == "accuracy"
    lost, _ = verdict_of(loss, accuracy_verdict(base_hits, own_hits, [1] * n, tokens, 0.7, 64))
    assert lost.decided and not lost.passed


def test_token_accuracy_counts_only_where_the_adapter_gained_it():
    from zenedge.pool.verdict import accuracy_verdict, verdict_of

    tokens = [40] * 16
    assert accuracy_verdict([10] * 16, [11] * 16, [0] * 16, tokens, 0.7, 64) is None   # +2.5 points only
    loss = verdict([30.0] * 16, [20.0] * 16, [29.0] * 16, tokens, 0.7, 64)
    assert verdict_of(loss, None) == (loss, "loss")


def test_a_merge_that_keeps_the_likelihood_but_not_the_answers_is_refused():
    """`units` (BENCHMARKS.md): merges kept 0.72-0.81 of its likelihood gain and answered none of
    its examples. Loss alone (or loss OR accuracy) passes that; the floor on token accuracy
    (min(FLOOR, T) of the gain) refuses it. The gate's own wiring, from a member's reads."""
    from zenedge.evaluation import EncodedExample
    from zenedge.pool.gate import Member, QualityGate, _Set
    from zenedge.pool.verdict import FLOOR, accuracy_verdict, verdict_of

    n = 16
    examples = [EncodedExample((1, 2), (3, 4, 5, 6), "x", None) for _ in range(n)]
    member = Member("units", None, {}, None, True)
    reads = _Set(member, examples, 64, base=[8.0] * n, own=[1.0] * n,
                 merged=[2.4 + 0.1 * (i % 3) for i in range(n)],                # ~0.79 of the loss gain
                 base_hits=[0] * n, own_hits=[4] * n, merged_hits=[0] * n)      # none of the answers
    loss = verdict(reads.base, reads.own, reads.merged, reads.tokens, 0.7, 64)
    accuracy = accuracy_verdict(reads.base_hits, reads.own_hits, reads.merged_hits, reads.tokens, 0.7, 64)
    assert loss.decided and loss.passed and verdict_of(loss, accuracy)[0].passed   # the rule without a floor
    refused, metric = QualityGate._decide(reads, 0.7)
    assert refused.decided and not refused.passed and metric == "accuracy" and refused.retention == 0.0
    # Half the answers kept (at or above the floor): the loss pass stands.
    reads.merged_hits = [2] * n
    kept, metric = QualityGate._decide(reads, 0.7)
    assert FLOOR <= 0.5 and kept.decided and kept.passed and metric == "loss"


def test_the_floor_only_refuses():
    """A floor still undecided does not hold back a member that passes on the threshold; one clearly
    failed refuses it whatever the threshold tests say."""
    from zenedge.pool.verdict import Verdict, verdict_of

    passed, undecided = Verdict(True, True, 0.9, 16), Verdict(False, False, 0.55, 16)
    failed = Verdict(True, False, 0.1, 16)
    assert verdict_of(passed, undecided, ((passed, "loss"), (undecided, "accuracy"))) == (passed, "loss")
    assert verdict_of(passed, passed, ((passed, "loss"), (failed, "accuracy"))) == (failed, "accuracy")
