"""The loss scale's record: `LossScaleOptimizer`'s dynamic scale at each log event.

`LossScaleOptimizer` skips a step whose gradients hold an Inf or a NaN and
halves its scale, and doubles it after `dynamic_growth_steps` steps in a
row that it applied; a skipped step leaves the optimizer's iteration count,
the logged step, where it was. So between two log events the scale fell by
one half per skipped step and rose by one doubling per growth, and there
was no growth when the growth counter at the first event plus the steps
applied since is below `dynamic_growth_steps`: then the skipped steps are
exactly the halvings (`board/loss_scale.py` reads them so). It also holds
the train steps `fit` ran (`batches`, counted by `BatchCount`) and the
optimizer steps applied over them (`applied`): the steps skipped are their
difference, exactly, whatever the scale did. The record holds what that
needs, under the digest's plugin name so that it is kept whole:
docs/FORMAT.md.
"""

import math

import keras
import numpy as np

from tb_gradviz.format import digest, metadata

TAG = f"{digest.TAG_PREFIX}/loss_scale"
FIELDS = (
    "loss_scale",  # the scale at this log event (the probe's gradients were taken at it)
    "growth_counter",  # steps applied in a row since the scale last changed
    "growth_steps",  # dynamic_growth_steps: the applied steps in a row that double the scale
    "initial_scale",  # the scale the optimizer began with
    "batches",  # train steps the fits this callback was passed to ran (NaN: not counted)
    "applied",  # optimizer steps applied over those batches (NaN: not counted)
)


class BatchCount:
    """The train steps `fit` ran, and the optimizer steps applied over them.

    Counted without a batch hook of its own (one makes Keras wait for every
    batch): with a batch frequency the callback's batch hook gives each
    batch's index in its epoch (`batch_ended`), otherwise each epoch adds the
    steps `fit` announced for it (`epoch_ended(steps)`; an epoch that
    training stops in the middle of counts whole, and an epoch of unknown
    length makes the count unknown from then on). Applied steps are the
    optimizer's iterations gained during those fits; steps it made outside
    them (before the first, between two) are left out of both.
    """

    def __init__(self):
        self._batches = None  # batches of the epochs ended; None before the first fit
        self._in_epoch = 0  # batches of the current epoch (the batch hook)
        self._outside = 0  # optimizer steps made outside the counted fits
        self._last = None  # the optimizer's iterations at the end of the last fit

    def begin_fit(self, iterations):
        """A fit begins with the optimizer at `iterations`."""
        if self._batches is None:
            self._batches, self._outside = 0.0, iterations
        elif self._last is not None:
            self._outside += iterations - self._last
        self._in_epoch = 0

    def batch_ended(self, batch):
        """The batch hook: `batch` is the index in its epoch of the last step that ended."""
        self._in_epoch = batch + 1

    def epoch_ended(self, steps=0):
        """An epoch ended: it ran the batches the batch hook counted, plus `steps` (the epoch's
        length when no batch hook counts; None when unknown)."""
        if self._batches is not None:
            self._batches += (math.nan if steps is None else steps) + self._in_epoch
        self._in_epoch = 0

    def end_fit(self, iterations):
        """A fit ended with the optimizer at `iterations`."""
        self._last = iterations

    def values(self, iterations):
        """`(batches, applied)` with the optimizer at `iterations`; NaN before any fit."""
        if self._batches is None:
            return math.nan, math.nan
        return self._batches + self._in_epoch, float(iterations - self._outside)


def records(model, count=None):
    """The `(tag, array, metadata)` record of the model's `LossScaleOptimizer` (none without).

    Args:
      model: the model.
      count: the callback's `BatchCount`, or None (then `batches` and `applied` are NaN).
    """
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or not optimizer.built:
        return []
    vector = np.array(
        [
            float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)),
            float(keras.ops.convert_to_numpy(optimizer.step_counter)),
            float(optimizer.dynamic_growth_steps),
            float(optimizer.initial_scale),
            *(count or BatchCount()).values(int(keras.ops.convert_to_numpy(optimizer.iterations))),
        ]
    )
    content = {"kind": metadata.KIND_LOSS_SCALE, "fields": list(FIELDS)}
    return [
        (TAG, vector, metadata.create_summary_metadata(content, plugin_name=digest.PLUGIN_NAME))
    ]
