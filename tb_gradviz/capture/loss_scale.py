"""The loss scale's record: `LossScaleOptimizer`'s dynamic scale at each log event.

`LossScaleOptimizer` skips a step whose gradients hold an Inf or a NaN and
halves its scale, and doubles it after `dynamic_growth_steps` steps in a
row that it applied; a skipped step leaves the optimizer's iteration count,
the logged step, where it was. So between two log events the scale fell by
one half per skipped step and rose by one doubling per growth, and there
was no growth when the growth counter at the first event plus the steps
applied since is below `dynamic_growth_steps`: then the skipped steps are
exactly the halvings (`board/loss_scale.py` reads them so). The record holds
what that needs, under the digest's plugin name so that it is kept whole:
docs/FORMAT.md.
"""

import keras
import numpy as np

from tb_gradviz.format import digest, metadata

TAG = f"{digest.TAG_PREFIX}/loss_scale"
FIELDS = (
    "loss_scale",  # the scale at this log event (the probe's gradients were taken at it)
    "growth_counter",  # steps applied in a row since the scale last changed
    "growth_steps",  # dynamic_growth_steps: the applied steps in a row that double the scale
    "initial_scale",  # the scale the optimizer began with
)


def records(model):
    """The `(tag, array, metadata)` record of the model's `LossScaleOptimizer` (none without)."""
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or not optimizer.built:
        return []
    vector = np.array(
        [
            float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)),
            float(keras.ops.convert_to_numpy(optimizer.step_counter)),
            float(optimizer.dynamic_growth_steps),
            float(optimizer.initial_scale),
        ]
    )
    content = {"kind": metadata.KIND_LOSS_SCALE, "fields": list(FIELDS)}
    return [
        (TAG, vector, metadata.create_summary_metadata(content, plugin_name=digest.PLUGIN_NAME))
    ]
