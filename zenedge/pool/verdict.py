"""The quality gate's verdicts: pure statistics on per-example sums (no torch, no model).

For a member with an eval set, retention = (L_base − L_merged) / (L_base − L_member), with L the
teacher-forced answer loss on the member's own eval set; the member is kept if retention ≥ T, or
if the same ratio on answer tokens right (teacher-forced argmax) is ≥ T where its own adapter gains
at least ACCURACY_GAIN of them, and refused when either ratio is clearly below min(FLOOR, T)
(`verdict_of` says why).

The test is sequential: the gate reads a set's examples in a fixed shuffled order. Per example i,
z_i = (b_i − m_i) − T·(b_i − o_i) (summed answer-token losses: base, merged, own); the full-set
verdict "retention ≥ T" is exactly "Σ z ≥ 0". After MIN_EXAMPLES a verdict is given as soon as the
mean of z is CONFIDENCE standard errors (finite-population corrected) from 0, or once retention is
known to ±INDIFFERENCE (a merge on the threshold: either verdict is as good), so a clear pass or
fail reads few examples and a borderline one up to the gate's MAX_EXAMPLES.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

MIN_EXAMPLES = 16     # read before any verdict: enough for a first variance estimate
CONFIDENCE = 2.0      # standard errors between the mean of z and 0 before stopping early
INDIFFERENCE = 0.05   # a retention known to ±this around the threshold is too close to matter: decide
GAIN_EPS = 1e-3       # below this (nats per token), the member did not improve on the base: nothing to keep
ACCURACY_GAIN = 0.05  # a member whose own adapter gets this much more of its answer tokens right than the
                      # base (teacher-forced argmax) may also pass on keeping that gain (see `verdict_of`)
FLOOR = 0.5           # ... and is refused when clearly below this much of it in either (or the threshold)


def retention(base_loss: float, own_loss: float, merged_loss: float) -> float:
    """Fraction of the member's loss improvement the merged adapter keeps (can be < 0 or > 1)."""
    gain = base_loss - own_loss
    if gain < GAIN_EPS:  # the adapter never helped on its own set: only ask that merging not hurt
        return 1.0 if merged_loss <= max(base_loss, own_loss) + GAIN_EPS else 0.0
    return (base_loss - merged_loss) / gain


@dataclass(frozen=True)
class Verdict:
    decided: bool
    passed: bool
    retention: float      # on the examples read so far
    examples: int


def verdict(base: Sequence[float], own: Sequence[float], merged: Sequence[float], tokens: Sequence[int],
            threshold: float, population: int) -> Verdict:
    """Sequential test of "retention ≥ threshold on the whole set" from the first n examples
    (per-example summed losses; `population` = how many the whole set has). Decided when every
    example is read, or when n ≥ MIN_EXAMPLES and the mean of z is CONFIDENCE standard errors
    (with the finite-population correction) away from 0."""
    n = len(merged)
    count = max(1, sum(tokens[:n]))
    b, o, m = sum(base[:n]) / count, sum(own[:n]) / count, sum(merged[:n]) / count
    value = retention(b, o, m)
    gain = 0.0   # per example, for the indifference zone (none when there is no gain to keep)
    if b - o < GAIN_EPS:  # the same rule as retention(): the merge must not hurt
        ref = base if b >= o else own
        z = [ref[i] + GAIN_EPS * tokens[i] - merged[i] for i in range(n)]
    else:
        z = [(base[i] - merged[i]) - threshold * (base[i] - own[i]) for i in range(n)]
        gain = (sum(base[:n]) - sum(own[:n])) / n
    total = sum(z)
    if n >= population:
        return Verdict(True, total >= 0, value, n)
    if n < MIN_EXAMPLES:
        return Verdict(False, False, value, n)
    mean = total / n
    variance = sum((v - mean) ** 2 for v in z) / (n - 1)
    error = math.sqrt(variance / n * (population - n) / max(1, population - 1))
    if mean - CONFIDENCE * error > 0:
        return Verdict(True, True, value, n)
    if mean + CONFIDENCE * error < 0:
        return Verdict(True, False, value, n)
    # Retention - threshold = mean(z) / gain: once its interval is narrower than ±INDIFFERENCE the
    # merge sits on the threshold, where either verdict is as good; reading on would not change that.
    if CONFIDENCE * error < INDIFFERENCE * gain:
        return Verdict(True, mean >= 0, value, n)
    return Verdict(False, False, value, n)


def accuracy_verdict(base: Sequence[int], own: Sequence[int], merged: Sequence[int], tokens: Sequence[int],
                     threshold: float, population: int) -> Verdict | None:
    """The same sequential test on teacher-forced answer-token accuracy (hits per example: more is
    better, so the counts go in negated); None where the member's own adapter does not get at least
    ACCURACY_GAIN more of its answer tokens right than the base (then there is no such gain to keep,
    and "not worse than the base" would pass anything)."""
    n = len(merged)
    if (sum(own[:n]) - sum(base[:n])) < ACCURACY_GAIN * max(1, sum(tokens[:n])):
        return None
    return verdict([-v for v in base], [-v for v in own], [-v for v in merged], tokens, threshold, population)


def verdict_of(loss: Verdict, accuracy: Verdict | None,
               floors: Sequence[tuple[Verdict, str]] = ()) -> tuple[Verdict, str]:
    """A member keeps enough of its gain if the merge keeps `threshold` of it in answer likelihood OR
    in answer tokens right, unless it is clearly below the floor in either (`floors`: both tests at
    min(FLOOR, threshold)). Loss alone is harsh on near-deterministic tasks (a merged adapter can
    still answer every example right while keeping little of an almost-zero loss's gain); token
    accuracy alone says little where answers are free text; and either one alone lets through a
    merge that keeps the likelihood and loses the answers (BENCHMARKS.md). The floor only refuses:
    a pass does not wait for its verdict (token accuracy is the noisier of the two)."""
    if accuracy is None:
        return loss, "loss"
    for value, metric in floors:
        if value.decided and not value.passed:
            return value, metric
    for value, metric in ((loss, "loss"), (accuracy, "accuracy")):
        if value.decided and value.passed:
            return value, metric
    if loss.decided and accuracy.decided:
        return max(((loss, "loss"), (accuracy, "accuracy")), key=lambda pair: pair[0].retention)
    return Verdict(False, False, max(loss.retention, accuracy.retention), loss.examples), "loss"
