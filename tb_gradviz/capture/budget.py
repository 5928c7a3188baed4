"""The callback's cost budget: when to log, so that logging takes a bounded share of training.

`Budget` owns the log schedule and what it is decided from. Its caller (the callback) tells it
when a fit begins and ends, when units pass (optimizer steps, or epochs, as asked), and when each
log event starts and ends; it asks `due` whether to log now. Nothing else keeps a count of units.

The schedule: events are due one interval apart, in units, from the first multiple of the interval
asked for; an event comes at the first unit at or after its due one (later only when Keras calls
the batch hook every `steps_per_execution` steps). Without a budget the interval is the one asked
for. With a budget it is the smallest whole multiple of the one asked for at which

    share = event_seconds / (event_seconds + interval * unit_seconds) <= budget,

where `event_seconds` is the mean cost of a log event and `unit_seconds` the mean training time
of a unit, both running means of what was measured (each newest measurement weighs `_SMOOTHING`),
so the interval follows a change in either within a few events and holds still while neither
changes.
It never logs more often than asked. The interval is decided at each event and holds until the
next; due events are never closer than it.

The measurement holds across `fit` calls: log time is the time from `log_started` to
`log_ended`, training time the wall time within fits between log events (time between fits is
not training), and the count of units goes on from one fit to the next. The first event of the
callback's life, and the first after the probe pass or the model's train function is built
again, are left out of the measurement together with the training before them: both include
compilation. Without a budget it warns once when the share passes `WARN_SHARE`
(after `WARN_AFTER_SECONDS` measured).

With a budget, each log event records what was measured and decided (`Budget.records`), under
the digest's plugin name so that it is kept whole: docs/FORMAT.md.
"""

import math
import time
import warnings

import numpy as np

from tb_gradviz.format import digest, metadata

WARN_SHARE = 0.10
# ... once this much time is measured: a short fit's share says little.
WARN_AFTER_SECONDS = 5.0
# Weight of the newest measurement in the running means the interval is decided from: a
# change in the step time shows within a few log events, and one slow event (a pause, a
# garbage collection) moves it by less than a third of its excess.
_SMOOTHING = 0.3
# A needed interval within this of a whole number of asked intervals is that number (the
# quotient of measured times is not exact in floating point).
_ROUNDING = 1e-9

TAG = f"{digest.TAG_PREFIX}/budget"
FIELDS = (
    "budget",  # the share asked for
    "asked_interval",  # the interval asked for (batches or epochs)
    "interval",  # the interval used from this log event to the next
    "share",  # measured: log time / (log time + training time), the callback's life so far
    "log_seconds",  # measured log time, the callback's life so far
    "train_seconds",  # measured training time between log events, the callback's life so far
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
    """The log schedule, and the measurement of logging's share of training time it follows.

    Args:
      budget: None, or the share of training time logging may take, in (0, 1).
      asked: the interval asked for, in units (batches or epochs), >= 1.
      clock: seconds as a float; `time.perf_counter` unless a test passes its own.

    Attributes:
      interval: the interval in force, in units: a whole multiple of `asked`.
      position: units passed, as the caller counts them (`begin_fit`, `passed`).
      log_seconds, train_seconds: the measured log time and training time so far.
    """

    def __init__(self, budget=None, asked=1, clock=time.perf_counter):
        self.budget = check_budget(budget)
        self.asked = asked
        self.interval = asked
        self.position = 0
        self.log_seconds = 0.0
        self.train_seconds = 0.0
        self._clock = clock
        self._warned = False
        self._anchored = False
        self._next_due = asked
        self._mean_event = None
        self._mean_unit = None
        # The training since the last event: time within fits, and units.
        self._train_pending = 0.0
        self._units_pending = 0
        # When the current stretch of training began; None while none runs.
        self._training_since = None
        self._in_fit_or_loop = True  # False between `end_fit` and `begin_fit`
        self._leave_out = True
        self._started = None

    def begin_fit(self, position=None, rebuilt=False):
        """A fit begins: training time counts again from now.

        Args:
          position: the caller's count of units now (the optimizer's iterations), or None to go
            on counting from `passed` alone. The first one anchors the schedule at the first
            multiple of `asked` after it; a later one that differs from `position` (units passed
            where this budget did not see them: another optimizer, a fit without the callback)
            moves the due event with it, so the units left until it stay as they were.
          rebuilt: the probe pass or the train function was built for this fit: the next event
            and the training before it include compilation and are left out of the measurement.
        """
        if position is not None:
            if not self._anchored:
                self._next_due = (position // self.asked + 1) * self.asked
            else:
                self._next_due += position - self.position
            self.position = position
        self._anchored = True
        self._leave_out = self._leave_out or rebuilt
        self._in_fit_or_loop = True
        self._training_since = self._clock()

    def end_fit(self):
        """A fit ends: the time until the next `begin_fit` is not training."""
        self._stop_training_clock()
        self._in_fit_or_loop = False

    def passed(self, units):
        """`units` more units of training have passed (batches or epochs, as asked)."""
        self.position += units
        self._units_pending += units

    @property
    def due(self):
        """Whether the schedule has an event due now."""
        return self.position >= self._next_due

    def due_after(self, units):
        """Whether an event will be due once `units` more units have passed."""
        return self.position + units >= self._next_due

    @property
    def share(self):
        """The measured share of logging in the time measured so far (NaN before any)."""
        total = self.log_seconds + self.train_seconds
        return self.log_seconds / total if total > 0 else math.nan

    def log_started(self):
        self._stop_training_clock()
        self._started = self._clock()

    def log_ended(self):
        """Measures the event `log_started` began, decides the interval and the next due event.

        A due event moves the next one an interval on (past `position`); an event called for
        while none is due leaves the schedule as it was.
        """
        end = self._clock()
        if self._leave_out:
            self._leave_out = False
        else:
            self._measure(end - self._started)
        if self.due:
            behind = self.position - self._next_due
            self._next_due += self.interval * (behind // self.interval + 1)
        self._train_pending, self._units_pending = 0.0, 0
        if self._in_fit_or_loop:
            self._training_since = end

    def _stop_training_clock(self):
        if self._training_since is not None:
            self._train_pending += max(self._clock() - self._training_since, 0.0)
            self._training_since = None

    def _measure(self, spent):
        self.log_seconds += spent
        self.train_seconds += self._train_pending
        self._mean_event = _smoothed(self._mean_event, spent)
        if self._units_pending > 0:
            per_unit = self._train_pending / self._units_pending
            self._mean_unit = _smoothed(self._mean_unit, per_unit)
        if self.budget is not None:
            if self._mean_unit:
                self.interval = self._interval_for_budget()
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

    def _interval_for_budget(self):
        # event / (event + interval * unit) <= budget
        needed = self._mean_event * (1 - self.budget) / (self.budget * self._mean_unit)
        return self.asked * max(1, math.ceil(needed / self.asked - _ROUNDING))

    def records(self):
        """The `(tag, array, metadata)` record of what was measured and decided (none without)."""
        if self.budget is None:
            return []
        vector = np.array(
            [
                self.budget,
                self.asked,
                self.interval,
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
