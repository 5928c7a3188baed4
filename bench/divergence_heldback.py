"""The divergence suite's held-back cases: models and settings the warnings were not tuned on.

Each builder takes `(steps, seed)`, clears Keras' session, seeds every
generator, and returns `(model, x, y, batch_size)` with the model compiled
and `steps` batches of generated data. The diverging ones grow their
learning rate from `RAMP_START` (after each series has its baseline) by a
factor other than the tuning set's, in networks the tuning set lacks:
saturating units under Adam and under SGD with momentum, a transformer
with GELU, a float16 CNN, a recurrent network. The healthy ones train as
people train: real schedules, frozen lower layers, dropout.
"""

import keras
import numpy as np

from tb_gradviz import demos
from tb_gradviz.divergence_cases import RAMP_START, RampedRate, transformer_case

BATCH = 32
FEATURES, CLASSES = 32, 8
LENGTH, CHANNELS = 20, 8


def _start(seed):
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)


def _cross_entropy():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _ramped(base, factor):
    return RampedRate(base, RAMP_START, factor)


def _features(steps, seed):
    """Normal features and a class that a noisy linear map of them picks."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps * BATCH, FEATURES)).astype("float32")
    mixing = rng.standard_normal((FEATURES, CLASSES))
    noise = 0.5 * rng.standard_normal((steps * BATCH, CLASSES))
    return x, np.argmax(x @ mixing + noise, axis=1).astype("int32")


def _sequences(steps, seed):
    """Sequences of normal vectors, classed by their mean over time: the net must remember."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps * BATCH, LENGTH, CHANNELS)).astype("float32")
    mixing = rng.standard_normal((CHANNELS, 4))
    return x, np.argmax(x.mean(axis=1) @ mixing, axis=1).astype("int32")


def _mlp(activation, width=64, depth=4, dropout=0.0):
    layers = [keras.Input((FEATURES,))]
    for i in range(depth):
        layers.append(keras.layers.Dense(width, activation=activation, name=f"dense{i}"))
        if dropout:
            layers.append(keras.layers.Dropout(dropout, name=f"drop{i}"))
    layers.append(keras.layers.Dense(CLASSES, name="logits"))
    return keras.Sequential(layers, name=f"mlp_{activation}")


def _rnn():
    return keras.Sequential(
        [
            keras.Input((LENGTH, CHANNELS)),
            keras.layers.SimpleRNN(32, return_sequences=True, name="rnn0"),
            keras.layers.SimpleRNN(32, name="rnn1"),
            keras.layers.Dense(4, name="logits"),
        ],
        name="rnn",
    )


def tanh_adam(steps, seed, ramp=None):
    """A tanh MLP (4 x 64) trained by Adam(1e-3); with `ramp`, its rate grows from `RAMP_START`."""
    _start(seed)
    x, y = _features(steps, seed)
    model = _mlp("tanh")
    model.compile(
        keras.optimizers.Adam(1e-3 if ramp is None else _ramped(1e-3, ramp)), _cross_entropy()
    )
    return model, x, y, BATCH


def sigmoid_momentum(steps, seed, ramp):
    """A sigmoid MLP (2 x 64) trained by SGD(1e-1, momentum 0.9), its rate ramped. (Deeper, it
    learns nothing in 200 steps at this rate.)"""
    _start(seed)
    x, y = _features(steps, seed)
    model = _mlp("sigmoid", depth=2)
    model.compile(keras.optimizers.SGD(_ramped(1e-1, ramp), momentum=0.9), _cross_entropy())
    return model, x, y, BATCH


def transformer_gelu(steps, seed, ramp):
    """The tuning set's transformer with GELU units, its rate ramped by another factor: the
    attention and output logits grow until the loss does."""
    return transformer_case(steps, seed, 1e-3, ramp, activation="gelu")


def float16_cnn(steps, seed, ramp):
    """The demo's small CNN under `mixed_float16` without loss scaling (its logits in float32),
    Adam(1e-3) ramped."""
    _start(seed)
    x, y = demos.pattern_images(steps * BATCH, 32, seed)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = demos.small_cnn("max")
    finally:
        keras.mixed_precision.set_global_policy(previous)
    model.compile(
        keras.optimizers.Adam(_ramped(1e-3, ramp)), _cross_entropy(), auto_scale_loss=False
    )
    return model, x, y, BATCH


def rnn(steps, seed, ramp=None):
    """Two SimpleRNN layers (tanh, 32 units) over 20 steps, Adam(1e-3); `ramp` as `tanh_adam`'s."""
    _start(seed)
    x, y = _sequences(steps, seed)
    model = _rnn()
    model.compile(
        keras.optimizers.Adam(1e-3 if ramp is None else _ramped(1e-3, ramp)), _cross_entropy()
    )
    return model, x, y, BATCH


def cnn_warmup_cosine(steps, seed):
    """The small CNN under Adam, its rate warmed up linearly over the first 10 % of the steps to
    2e-3, then decayed by a cosine to zero at the last step."""
    _start(seed)
    x, y = demos.pattern_images(steps * BATCH, 32, seed)
    model = demos.small_cnn("max")
    warmup = max(steps // 10, 1)
    rate = keras.optimizers.schedules.CosineDecay(
        0.0, steps - warmup, warmup_target=2e-3, warmup_steps=warmup
    )
    model.compile(keras.optimizers.Adam(rate), _cross_entropy())
    return model, x, y, BATCH


def tanh_step_decay(steps, seed):
    """The tanh MLP under SGD(momentum 0.9), its rate 5e-2 divided by 10 at 40 % and at 75 % of
    the steps."""
    _start(seed)
    x, y = _features(steps, seed)
    model = _mlp("tanh")
    rate = keras.optimizers.schedules.PiecewiseConstantDecay(
        [int(steps * 0.4), int(steps * 0.75)], [5e-2, 5e-3, 5e-4]
    )
    model.compile(keras.optimizers.SGD(rate, momentum=0.9), _cross_entropy())
    return model, x, y, BATCH


def cnn_finetune_frozen(steps, seed):
    """The small CNN trained 100 steps on one set of patterns (not logged), then its convolutions
    frozen (`trainable=False`) and a new head fine-tuned by Adam(1e-3) on other images."""
    _start(seed)
    pretrain_x, pretrain_y = demos.pattern_images(100 * BATCH, 32, seed + 1000)
    base = demos.small_cnn("max")
    base.compile(keras.optimizers.Adam(1e-3), _cross_entropy())
    base.fit(pretrain_x, pretrain_y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for layer in base.layers[:-1]:
        layer.trainable = False
    features = base.get_layer("gap").output
    hidden = keras.layers.Dense(32, activation="relu", name="head")(features)
    outputs = keras.layers.Dense(len(demos.PATTERNS), name="new_logits")(hidden)
    model = keras.Model(base.inputs, outputs, name="finetuned")
    model.compile(keras.optimizers.Adam(1e-3), _cross_entropy())
    x, y = demos.pattern_images(steps * BATCH, 32, seed)
    return model, x, y, BATCH


def mlp_dropout(steps, seed):
    """A ReLU MLP (3 x 128) with dropout 0.2 after each hidden layer, Adam(1e-3)."""
    _start(seed)
    x, y = _features(steps, seed)
    model = _mlp("relu", width=128, depth=3, dropout=0.2)
    model.compile(keras.optimizers.Adam(1e-3), _cross_entropy())
    return model, x, y, BATCH


def cases():
    """`{name: (diverges, build(steps, seed))}` of the held-back set."""
    return {
        "tanh_adam_ramp": (True, lambda s, r: tanh_adam(s, r, ramp=1.04)),
        "sigmoid_momentum_ramp": (True, lambda s, r: sigmoid_momentum(s, r, ramp=1.03)),
        "transformer_gelu_ramp": (True, lambda s, r: transformer_gelu(s, r, ramp=1.04)),
        "float16_cnn_ramp": (True, lambda s, r: float16_cnn(s, r, ramp=1.04)),
        "rnn_ramp": (True, lambda s, r: rnn(s, r, ramp=1.04)),
        "cnn_warmup_cosine": (False, cnn_warmup_cosine),
        "tanh_step_decay": (False, tanh_step_decay),
        "cnn_finetune_frozen": (False, cnn_finetune_frozen),
        "mlp_dropout": (False, mlp_dropout),
        "rnn_healthy": (False, lambda s, r: rnn(s, r)),
    }
