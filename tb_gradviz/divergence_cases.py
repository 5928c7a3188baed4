"""Models that diverge reproducibly, and the same models at sane settings, on generated data.

The divergence suite (bench/bench_divergence.py) measures how early the
warnings come on them; `tb-gradviz demo` trains the transformer at a sane
rate and the float16 network whose learning rate grows until its
gradients overflow. Each case returns a compiled model and its data;
each clears Keras' session and seeds every generator first, so a case's
weights and names do not depend on what ran before it.
"""

import keras
import numpy as np

# The step from which a ramped learning rate grows: the warnings judge a step against the 100
# steps before it, from 50 steps on, so the ramp starts once each series has a baseline.
RAMP_START = 100


class RampedRate(keras.optimizers.schedules.LearningRateSchedule):
    """A learning rate of `base` until step `start`, then multiplied by `factor` at each step."""

    def __init__(self, base, start, factor):
        self.base, self.start, self.factor = base, start, factor

    def __call__(self, step):
        ops = keras.ops
        past = ops.maximum(ops.cast(step, "float32") - self.start, 0.0)
        return self.base * ops.power(self.factor, past)

    def get_config(self):
        return {"base": self.base, "start": self.start, "factor": self.factor}


def _rate(learning_rate, ramp):
    return learning_rate if ramp is None else RampedRate(learning_rate, RAMP_START, ramp)


def _start(seed):
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)


def transformer_case(steps, seed, learning_rate, ramp=None, activation="relu"):
    """A two-block transformer (`MultiHeadAttention`, `LayerNormalization`) trained by Adam.

    Sequences of 16 tokens from 32; the target at each position is the
    sequence's sorted token at that position, which attention across
    positions can learn.

    Args:
      steps: batches of data to generate (32 sequences each).
      seed: seeds the weights and the data.
      learning_rate: Adam's rate.
      ramp: None for a fixed rate, or the factor it grows by at each step
        from `RAMP_START`.
      activation: the feed-forward layers' activation. With "relu" some of
        the second block's units never fire on the probe batch (a `dead`
        flag); "gelu" has no such units.

    Returns:
      `(model, x, y, batch_size)`, the model compiled.
    """
    _start(seed)
    batch_size, length, vocabulary, width = 32, 16, 32, 32
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocabulary, (steps * batch_size, length)).astype("int32")
    y = np.sort(x, axis=1)
    inputs = keras.Input((length,), dtype="int32")
    h = keras.layers.Embedding(vocabulary, width, name="embed")(inputs)
    for block in range(2):
        attended = keras.layers.MultiHeadAttention(2, width // 2, name=f"attn{block}")(h, h)
        h = keras.layers.LayerNormalization(name=f"norm{block}a")(h + attended)
        hidden = keras.layers.Dense(2 * width, activation=activation, name=f"ff{block}a")(h)
        h = keras.layers.LayerNormalization(name=f"norm{block}b")(
            h + keras.layers.Dense(width, name=f"ff{block}b")(hidden)
        )
    outputs = keras.layers.Dense(vocabulary, name="logits")(h)
    model = keras.Model(inputs, outputs, name="transformer")
    model.compile(
        keras.optimizers.Adam(_rate(learning_rate, ramp)),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model, x, y, batch_size


def mixed_case(steps, seed, ramp=None):
    """A dense ReLU network (4 x 32 units) under `mixed_float16` without loss scaling, trained by
    SGD(1e-2) on a regression of 16 normal features.

    With `ramp`, the rate grows by that factor at each step from
    `RAMP_START`: the weights' updates jump, then the weights, then the
    float16 activations and gradients grow until the gradients overflow to
    Inf, and the update after them writes NaN into the weights. The global
    policy is restored before returning.

    Returns:
      `(model, x, y, batch_size)`, the model compiled.
    """
    _start(seed)
    batch_size, features = 32, 16
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps * batch_size, features)).astype("float32")
    y = np.tanh(x @ rng.standard_normal((features, 1))).astype("float32")
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        inputs = keras.Input((features,))
        h = inputs
        for i in range(4):
            h = keras.layers.Dense(32, activation="relu", name=f"dense{i}")(h)
        outputs = keras.layers.Dense(1, name="out", dtype="float32")(h)
        model = keras.Model(inputs, outputs, name="mixed_mlp")
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.compile(keras.optimizers.SGD(_rate(1e-2, ramp)), "mse", auto_scale_loss=False)
    return model, x, y, batch_size
