"""The callback's cost budget: how often to log so that logging takes a bounded share of training.

`Budget` times each log event against the training time between log
events (the wall time from the end of one log event to the start of the
next) and, with a budget, stretches the interval the user asked for to a
whole multiple of it, so that the share of time spent logging stays within
the budget; it never logs more often than asked. Without a budget it warns
once when the share passes `WARN_SHARE` (after `WARN_AFTER_SECONDS`
measured). The first log event of a fit is left out of the measurement: it
builds and compiles the probe pass.

With a budget, each log event records what was measured and decided
(`Budget.records`), under the digest's plugin name so that it is kept
whole: docs/FORMAT.md.
"""

import math
import time
import warnings

import numpy as np

from tb_gradviz.format import digest, metadata

WARN_SHARE = 0.10
# ... once this much time is measured: a short fit's share says little.
WARN_AFTER_SECONDS = 5.0
# Weight of the newest measurement in the running means the interval is
# decided from: a change in the step time shows within a few log events.
_SMOOTHING = 0.3

TAG = f"{digest.TAG_PREFIX}/budget"
FIELDS = (
    "budget",  # the share asked for
    "asked_interval",  # the interval asked for (batches or epochs)
    "interval",  # the interval used from this log event to the next
    "share",  # measured: log time / (log time + training time), this fit so far
    "log_seconds",  # measured log time, this fit so far
    "train_seconds",  # measured training time between log events, this fit so far
)


def check_budget(budget):
    """Returns `budget` as a float in (0, 1), or None.

    Raises:
      TypeError: not a number.
      ValueError: not strictly between 0 and 1.
    """
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.floating, np.integer)):
        raise TypeError(
            "budget must be None or a number between 0 and 1 (the share of training time "
            f"logging may take, e.g. 0.02). Received: budget={budget!r} of type "
            f"{type(budget).__name__}"
        )
    if not 0 < budget < 1:
        raise ValueError(
            "budget must be strictly between 0 and 1 (the share of training time logging may "
            f"take, e.g. 0.02). Received: budget={budget!r}"
        )
    return float(budget)


class Budget:
    """Measures the log events' share of training time and decides the interval.

    Args:
      budget: None, or the share of training time logging may take, in (0, 1).
      clock: seconds as a float; `time.perf_counter` unless a test passes its own.
    """

    def __init__(self, budget=None, clock=time.perf_counter):
        self.budget = check_budget(budget)
        self._clock = clock
        self._warned = False
        self.begin_fit()

    def begin_fit(self):
        """Starts a new measurement (at each `fit`): the first log event is again left out."""
        self.factor = 1
        self.log_seconds = 0.0
        self.train_seconds = 0.0
        self._started = None
        self._last_end = None
        self._mean_log = None
        self._mean_train_per_unit = None

    def interval(self, asked):
        """The interval to log at: `asked` times the factor the budget needs (1 without one)."""
        return asked * self.factor

    @property
    def share(self):
        """The measured share of logging in the time measured so far (NaN before any)."""
        total = self.log_seconds + self.train_seconds
        return self.log_seconds / total if total > 0 else math.nan

    def log_started(self):
        self._started = self._clock()

    def log_ended(self):
        """Measures the log event that `log_started` began and decides the next interval."""
        end = self._clock()
        spent = end - self._started
        if self._last_end is not None:
            train = max(self._started - self._last_end, 0.0)
            self.log_seconds += spent
            self.train_seconds += train
            self._mean_log = _smoothed(self._mean_log, spent)
            self._mean_train_per_unit = _smoothed(self._mean_train_per_unit, train / self.factor)
            if self.budget is not None:
                self.factor = self._factor_for_budget()
            elif (
                not self._warned
                and self.log_seconds + self.train_seconds >= WARN_AFTER_SECONDS
                and self.share > WARN_SHARE
            ):
                self._warned = True
                warnings.warn(
                    f"tb_gradviz: logging takes {self.share:.0%} of training time "
                    f"({self.log_seconds:.1f} s of {self.log_seconds + self.train_seconds:.1f} s); "
                    "log less often (every_n_batches, every_n_epochs), choose fewer layers, "
                    "or pass budget=0.02 to let the callback stretch the interval",
                    stacklevel=3,
                )
        self._last_end = end

    def _factor_for_budget(self):
        # log / (log + factor * train_per_unit) <= budget
        if not self._mean_train_per_unit:
            return max(self.factor * 2, 1)
        needed = self._mean_log * (1 - self.budget) / (self.budget * self._mean_train_per_unit)
        return max(1, math.ceil(needed))

    def records(self, asked):
        """The `(tag, array, metadata)` record of what was measured and decided (none without)."""
        if self.budget is None:
            return []
        vector = np.array(
            [
                self.budget,
                asked,
                self.interval(asked),
                self.share,
                self.log_seconds,
                self.train_seconds,
            ]
        )
        content = {"kind": metadata.KIND_BUDGET, "fields": list(FIELDS)}
        return [
            (
                TAG,
                vector,
                metadata.create_summary_metadata(content, plugin_name=digest.PLUGIN_NAME),
            )
        ]


def _smoothed(mean, value):
    return value if mean is None else (1 - _SMOOTHING) * mean + _SMOOTHING * value
