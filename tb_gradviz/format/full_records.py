"""Which log events keep their full records: a schedule, and the flags that override it.

Every log event writes its digest (`digest`) and the run's other records
under the digest's plugin name (the budget's, the loss scale's): a few values
per tensor, at every event, so that the flags, the onset and the time views
see every logged step. The full records (each tensor's histogram, stats and
precision records, routing, units, routing maps, weight updates: every
record under `metadata.PLUGIN_NAME` or the histograms plugin) are the bulk
of an event's bytes, so they are written only

* at the events the schedule names (`scheduled`): every event of the first
  `first` ones, then at spacings that grow by one event each time (1, 2,
  3, ... events), so that a run of `n` events keeps about
  `first + sqrt(2 * (n - first))` of them; `first=None` keeps every event;
* at an event where a flag (`health.FLAGS`) is first raised by any layer,
  and at the event before it: a log event's full records are held in memory,
  unwritten, until the next event decides (`Keeper`).

Flags are judged once per event (`judgement.Judge`, at `health`'s default
ratio), as `/onset` and `check` judge the written run, so the onset step
that `/onset` names has its full records, and so has the step before it.

The full records of the event before an onset are written after that
event's digest, as an event of their own at the same step: TensorBoard reads
them as one more point of their series at that step (its readers drop points
only when a step goes back).

Numpy only.
"""

import math
import time

import numpy as np

from tb_gradviz.format import digest

ALL = "all"
# Every event of a short run (the demo's tens of events) keeps its full records.
DEFAULT_FIRST = 100


def check_first(full_records):
    """Returns the schedule's `first` from the callback's `full_records=`: an int, or None (all).

    Raises:
      TypeError: not an int or "all".
      ValueError: a negative int.
    """
    if full_records == ALL:
        return None
    if isinstance(full_records, (bool, np.bool_)) or not isinstance(
        full_records, (int, np.integer)
    ):
        raise TypeError(
            "full_records must be a number of log events >= 0 or 'all'. "
            f"Received: full_records={full_records!r}"
        )
    if full_records < 0:
        raise ValueError(
            "full_records must be a number of log events >= 0 or 'all'. "
            f"Received: full_records={full_records!r}"
        )
    return int(full_records)


def scheduled(index, first):
    """Whether the schedule keeps the full records of log event `index` (0 for the first).

    Every event below `first`; after them, the events `first + T - 1` for the
    triangular numbers `T` = 1, 3, 6, 10, ... (spacings 1, 2, 3, ... after event `first - 1`).
    `first=None` keeps every event.
    """
    if first is None or index < first:
        return True
    j = index - first + 1
    k = (math.isqrt(8 * j + 1) - 1) // 2
    return k * (k + 1) // 2 == j


def always_written(record):
    """Whether a `(tag, array, summary_metadata)` record is written at every event (the digest's
    plugin: the digest, the budget, the loss scale) rather than with the full records."""
    summary_metadata = record[2]
    return (
        summary_metadata is not None
        and summary_metadata.plugin_data.plugin_name == digest.PLUGIN_NAME
    )


class Keeper:
    """Decides, event by event, which records are written: the one owner of the schedule's
    state (events seen, flags raised so far, the last event's held full records).

    It holds across repeated `fit` calls with the same callback: the events
    are counted, and the flags remembered, from the first.
    """

    def __init__(self, first=DEFAULT_FIRST):
        self.first = first
        self.events = 0  # log events decided
        self.raised = set()  # flags raised at an event decided
        self._held = None  # `(step, full records, wall_time)` of the last event, unwritten

    def writes(self, step, event_records, judgement, wall_time=None):
        """What to write for one log event, in order: `[(step, records, wall_time)]`.

        The event's own entry holds its digest and its always-written records,
        and its full records when they are kept; before it, the previous
        event's held full records when this event first raises a flag. Each
        entry is to be written as one event, without adding a digest.

        Args:
          step: the event's step.
          event_records: its `(tag, array, summary_metadata)` records, without
            a digest.
          judgement: the event's `judgement.Judgement`: its digest, and the
            flags it raised.
          wall_time: its time (seconds since the epoch); defaults to now.
        """
        wall_time = time.time() if wall_time is None else wall_time
        event_records = list(event_records)
        found = judgement.digests
        onset = judgement.flags - self.raised
        self.raised |= judgement.flags
        keep = scheduled(self.events, self.first) or bool(onset)
        self.events += 1
        result = []
        if onset and self._held is not None:
            result.append(self._held)
        self._held = None
        always = [r for r in event_records if always_written(r)]
        full = [r for r in event_records if not always_written(r)]
        if keep:
            result.append((step, event_records + found, wall_time))
        else:
            result.append((step, always + found, wall_time))
            if full:
                self._held = (step, full, wall_time)
        return result
