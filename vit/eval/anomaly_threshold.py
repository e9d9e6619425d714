"""The score from which an image is called defective, set on validation images, with the record of how.

Two rules, chosen by what the validation images are:
- good images only: a target false-alarm rate r. With n good images, k = floor(r * n) of them may be flagged,
  so the threshold sits just above the (k + 1)-th highest score (the next float up): at most k good validation
  images score at or above it (ties included), and it is never the lowest score, which is what an F1 rule
  picks when there are no defects to find (anomalib #2433: its adaptive threshold flagged every normal image).
  A rate needs at least ceil(1 / r) images to allow one false alarm; with fewer, the threshold sits above every
  good image and `note` says how many the rate needs.
- good and defective images: the threshold that maximises F1 (defect = positive) over the scores themselves.
Either way `ThresholdChoice.record()` is what anomaly.py fit writes beside the bank (JSON: rule, inputs, result).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["ThresholdChoice", "threshold_at_false_alarm_rate", "threshold_at_best_f1", "choose_threshold",
           "check_false_alarm_rate"]


@dataclass(frozen=True)
class ThresholdChoice:
    """A threshold and how it was chosen (all plain numbers, for JSON)."""

    value: float  # an image scoring at or above it is a defect
    rule: str  # "false_alarm_rate" (good images only) or "f1" (good and defective images)
    good: int  # good validation images scored
    defective: int  # defective validation images scored
    target: float | None  # the false-alarm rate asked for (None: above every good image)
    false_alarms: int  # good validation images at or above `value`
    recall: float | None  # share of defective validation images at or above `value` (None without any)
    note: str = ""  # one line when the images were too few for the target

    def record(self) -> dict:
        return asdict(self)


def check_false_alarm_rate(rate: float | None) -> None:
    """None (above every good image) or a rate strictly between 0 and 1; anything else is one sentence."""
    if rate is not None and not (isinstance(rate, (int, float)) and 0 < rate < 1):
        raise ValueError(f"the false-alarm rate must be a share strictly between 0 and 1 (0.01: one good image in "
                         f"100 flagged), got {rate!r}; leave it out to set the threshold above every good image.")


def _finite(scores, what: str) -> np.ndarray:
    s = np.asarray(scores, np.float64).ravel()
    return s[np.isfinite(s)]


def threshold_at_false_alarm_rate(good_scores, rate: float | None = None) -> ThresholdChoice:
    """Just above the (k + 1)-th highest good score, k = floor(rate * n) (k = 0 when `rate` is None), so at most k
    of the n good images are flagged (`s >= value`) and the lowest score never is (rate < 1)."""
    check_false_alarm_rate(rate)
    s = np.sort(_finite(good_scores, "good"))[::-1]  # highest first
    if not len(s):
        raise ValueError("no good validation image could be scored; a threshold needs some good images.")
    n = len(s)
    k = 0 if rate is None else int(math.floor(rate * n + 1e-9))
    note = ""
    if rate is not None and k == 0:
        need = math.ceil(1 / rate - 1e-9)
        note = (f"a false-alarm rate of {rate:g} needs at least {need} good validation images to allow one false "
                f"alarm; with {n} the threshold sits above all of them.")
    value = float(np.nextafter(s[k], np.inf))  # s[k]: the (k + 1)-th highest; ties with it stay below `value`
    return ThresholdChoice(value, "false_alarm_rate", n, 0, rate, int((s >= value).sum()), None, note)


def threshold_at_best_f1(good_scores, defective_scores) -> ThresholdChoice:
    """The score t among the defective ones that maximises F1 of `s >= t` (defects positive); on equal F1 the
    highest t (fewer false alarms). Needs at least one image of each kind."""
    g, d = _finite(good_scores, "good"), _finite(defective_scores, "defective")
    if not len(g) or not len(d):
        raise ValueError(f"an F1 threshold needs good and defective validation images ({len(g)} good, {len(d)} "
                         "defective scored); without defects use a false-alarm rate.")
    cand = np.unique(d)  # F1 only rises as t moves up to the next defective score, so the optimum is one of them
    tp = len(d) - np.searchsorted(np.sort(d), cand, side="left")  # defects with s >= t
    fp = len(g) - np.searchsorted(np.sort(g), cand, side="left")
    f1 = 2 * tp / (2 * tp + fp + (len(d) - tp))
    best = int(np.flatnonzero(f1 == f1.max())[-1])
    t = float(cand[best])
    return ThresholdChoice(t, "f1", len(g), len(d), None, int(fp[best]), float(tp[best] / len(d)))


def choose_threshold(good_scores, defective_scores=None, rate: float | None = None) -> ThresholdChoice:
    """F1-optimal when some defective validation scores are given, else at the false-alarm `rate` on good ones."""
    check_false_alarm_rate(rate)
    if defective_scores is not None and len(_finite(defective_scores, "defective")):
        return threshold_at_best_f1(good_scores, defective_scores)
    return threshold_at_false_alarm_rate(good_scores, rate)
