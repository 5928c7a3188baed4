"""The demos: ResNet50, small CNNs, a transformer and a run that diverges, trained with
GradVizCallback on generated data.

The data is generated deterministically (no download): the CNNs' images are
`demo_data`'s patterns, the transformer's and the diverging network's data
`divergence_cases`'.

Each run also holds each step's training loss and accuracy as TensorBoard
scalars, so the Scalars dashboard shows the model learning next to the
GradViz tab.
"""

import functools
import os

import keras

from tb_gradviz import divergence_cases
from tb_gradviz.capture.callback import GradVizCallback
from tb_gradviz.demo_data import PATTERNS, pattern_images
from tb_gradviz.step_scalars import StepScalars

# What the ResNet50 demo logs: its two pooling layers and the output of
# each stage, so the compare grid shows how activations and gradients
# change with depth.
RESNET50_LAYERS = (
    "resnet50/conv1_relu",
    "resnet50/pool1_pool",
    "resnet50/conv2_block3_out",
    "resnet50/conv3_block4_out",
    "resnet50/conv4_block6_out",
    "resnet50/conv5_block3_out",
    "resnet50/avg_pool",
)


def _compile(model, optimizer, from_logits=True):
    """Compiles a demo model for its pattern classes: sparse cross-entropy, and accuracy."""
    model.compile(
        optimizer,
        keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits),
        metrics=["accuracy"],
    )


def _fit(model, log_dir, layers, x, y, batch_size, log_every, verbose, weights=False, stop_on=None):
    callback = GradVizCallback(
        log_dir,
        probe_data=(x[:batch_size], y[:batch_size]),
        layers=layers,
        every_n_batches=log_every,
        weights=weights,
        stop_on=stop_on,
    )
    callbacks = [callback, StepScalars(log_dir)]
    model.fit(
        x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=verbose, callbacks=callbacks
    )
    return callback


def resnet50(image_size):
    """ResNet50 (`weights=None`) for `image_size` px patterns, set up to learn in a few dozen steps.

    Keras' initialisation leaves each residual block adding a full-scale
    branch to its shortcut and the classifier confidently wrong (loss ~2.2,
    not ln 4 = 1.39); from there, at batch 16, SGD(0.01, momentum 0.9)
    diverges and Adam(1e-3) spends its first steps recovering. Two standard
    changes fix it: the last BatchNorm of each block starts with gamma = 0,
    so each block starts as its shortcut (Goyal et al. 2017, "Accurate,
    Large Minibatch SGD", 5.1), and the classifier starts at zero, every
    class at 1/4.
    """
    model = keras.applications.ResNet50(
        weights=None, input_shape=(image_size, image_size, 3), classes=len(PATTERNS)
    )
    for layer in model.layers:
        if layer.name.endswith("_3_bn"):  # conv2_block1_3_bn ... conv5_block3_3_bn: 16 blocks
            layer.gamma.assign(keras.ops.zeros_like(layer.gamma))
    classifier = model.get_layer("predictions")
    classifier.kernel.assign(keras.ops.zeros_like(classifier.kernel))
    return model


def train_resnet50(log_dir, steps=48, image_size=64, batch_size=16, log_every=4, verbose=1, seed=0):
    """Trains `resnet50(image_size)`, nested in a Sequential, for `steps` steps with Adam(1e-3).

    Args:
      log_dir: the run directory.
      steps: optimizer steps (one epoch of `steps` batches).
      image_size: input height and width (>= 32).
      batch_size: batch size; the probe batch is the first batch.
      log_every: log every N steps.
      verbose: Keras' progress bar (1) or silence (0).

    Returns:
      The paths of the logged layers.
    """
    keras.utils.set_random_seed(seed)
    x, y = pattern_images(steps * batch_size, image_size, seed)
    model = keras.Sequential(
        [keras.Input((image_size, image_size, 3)), resnet50(image_size)], name="demo"
    )
    # ResNet50's output is a softmax, hence from_logits=False.
    _compile(model, keras.optimizers.Adam(1e-3), from_logits=False)
    return _fit(
        model, log_dir, list(RESNET50_LAYERS), x, y, batch_size, log_every, verbose
    ).chosen_layers


def small_cnn(pooling="max"):
    """A two-block CNN for 32x32 images in [0, 1]; `pooling` is "max" or "average"."""
    pool = keras.layers.MaxPooling2D if pooling == "max" else keras.layers.AveragePooling2D
    return keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            # Centred inputs: with [0, 1] ones and no normalisation, the
            # first steps learn the offset, not the patterns.
            keras.layers.Rescaling(2.0, offset=-1.0, name="centre"),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
            pool(2, name="pool1"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
            pool(2, name="pool2"),
            keras.layers.GlobalAveragePooling2D(name="gap"),
            keras.layers.Dense(len(PATTERNS), name="logits"),
        ],
        name=f"cnn_{pooling}",
    )


def train_small_cnn(
    log_dir, pooling="max", steps=40, batch_size=64, log_every=5, verbose=1, seed=0
):
    """Trains `small_cnn(pooling)` on 32x32 patterns with Adam(1e-2); logs its pooling layers.

    A step of this CNN costs little, so a batch of 64 (less noise per step)
    lets both poolings learn in 40 steps.

    Returns:
      The paths of the logged layers.
    """
    keras.utils.set_random_seed(seed)
    x, y = pattern_images(steps * batch_size, 32, seed)
    model = small_cnn(pooling)
    _compile(model, keras.optimizers.Adam(1e-2))
    return _fit(model, log_dir, None, x, y, batch_size, log_every, verbose).chosen_layers


PLAIN_DEPTH = 20


def plain_cnn(activation):
    """A plain (no shortcut) CNN of `PLAIN_DEPTH` 3x3 convolutions for 16x16 images.

    `activation` "sigmoid": each convolution applies a sigmoid, whose slope is
    at most 1/4, so the gradient shrinks by orders of magnitude on its way
    to the first layers. "relu_bn": each convolution is followed by
    BatchNorm and ReLU, which keep it flowing.
    """
    stack = [keras.Input((16, 16, 3)), keras.layers.Rescaling(2.0, offset=-1.0, name="centre")]
    for i in range(1, PLAIN_DEPTH + 1):
        if activation == "sigmoid":
            stack.append(
                keras.layers.Conv2D(8, 3, padding="same", activation="sigmoid", name=f"conv{i:02d}")
            )
        else:
            stack += [
                keras.layers.Conv2D(8, 3, padding="same", name=f"conv{i:02d}"),
                keras.layers.BatchNormalization(name=f"bn{i:02d}"),
                keras.layers.ReLU(name=f"relu{i:02d}"),
            ]
    stack += [
        keras.layers.GlobalAveragePooling2D(name="gap"),
        keras.layers.Dense(len(PATTERNS), name="logits"),
    ]
    return keras.Sequential(stack, name=f"plain_{activation}")


def train_plain_cnn(log_dir, activation, steps=24, batch_size=16, log_every=8, verbose=1, seed=0):
    """Trains `plain_cnn(activation)` on 16x16 patterns with Adam(1e-2); logs every layer (the
    gradient-flow view).

    The rate and the length are what the ReLU network with BatchNorm needs
    to learn beyond chance from scratch (at Adam(1e-3) it stays at chance
    over so few steps: bench/RESULTS.md); the sigmoids' gradient vanishes
    at any rate. A step
    costs little beside a log event of every layer, so the run logs three
    events, as a shorter run would. With `weights=True`: the convolutions'
    kernels and biases, their gradients and update sizes are logged too.

    Returns:
      The paths of the logged layers.
    """
    keras.utils.set_random_seed(seed)
    x, y = pattern_images(steps * batch_size, 16, seed)
    model = plain_cnn(activation)
    _compile(model, keras.optimizers.Adam(1e-2))
    return _fit(
        model, log_dir, lambda layer: True, x, y, batch_size, log_every, verbose, weights=True
    ).chosen_layers


def train_mixed_cnn(log_dir, loss_scale, steps=10, batch_size=64, log_every=5, verbose=1, seed=0):
    """Trains `small_cnn("max")` under `mixed_float16`; logs every layer, with the precision record.

    `loss_scale` None: Keras' dynamic loss scale (from 2**15), which keeps the
    float16 gradients in float16's normal range. A number: a fixed scale
    (1.0: not scaled), under which most of the gradients' values are
    float16 subnormals, so the `underflow` flag is raised on the gradients.

    Returns:
      The paths of the logged layers.
    """
    keras.utils.set_random_seed(seed)
    x, y = pattern_images(steps * batch_size, 32, seed)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = small_cnn("max")
        optimizer = keras.optimizers.Adam(1e-2)
        if loss_scale is not None:
            optimizer = keras.optimizers.LossScaleOptimizer(
                optimizer, initial_scale=loss_scale, dynamic_growth_steps=2**31 - 1
            )
        _compile(model, optimizer)
        fitted = _fit(model, log_dir, lambda layer: True, x, y, batch_size, log_every, verbose)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return fitted.chosen_layers


def train_transformer(log_dir, steps=150, log_every=5, verbose=1, seed=0):
    """Trains the divergence suite's transformer (`divergence_cases.transformer_case`) with Adam
    at 1e-3 for `steps` steps; logs every layer it calls.

    Its feed-forward layers apply GELU: with ReLU, some units of the second
    block never fire on the probe batch, which the `dead` flag names, and
    this run is the demo's healthy one.

    Returns:
      The paths of the logged layers.
    """
    model, x, y, batch_size = divergence_cases.transformer_case(
        steps, seed, 1e-3, activation="gelu"
    )
    return _fit(model, log_dir, _called, x, y, batch_size, log_every, verbose).chosen_layers


def _called(layer):
    # MultiHeadAttention computes its attention in one fused op, without calling its softmax
    # and dropout layers: nothing would be logged for them.
    return not isinstance(layer, (keras.layers.Softmax, keras.layers.Dropout))


# The flags that say the diverging run has failed: it stops after the log event that raises one.
FAILURES = ("nonfinite", "exploding")
DIVERGING_RUN = "diverging_mlp"


def train_diverging_mlp(log_dir, steps=300, ramp=1.05, log_every=5, verbose=1, seed=0):
    """Trains the divergence suite's `mixed_overflow` case (`divergence_cases.mixed_case`): SGD
    whose rate grows by `ramp` per step from `divergence_cases.RAMP_START`, in `mixed_float16`
    without loss scaling, until its float16 gradients overflow and the update after them writes
    NaN into the weights.

    Logs every layer with `weights=True` (the update ratios that
    `update_spike` reads), and stops after the log event that raises one of
    `FAILURES` (`stop_on`), as a run guarded by the callback would.

    Returns:
      The paths of the logged layers.
    """
    model, x, y, batch_size = divergence_cases.mixed_case(steps, seed, ramp)
    every_layer, stop_on = (lambda layer: True), list(FAILURES)
    fitted = _fit(model, log_dir, every_layer, x, y, batch_size, log_every, verbose, True, stop_on)
    return fitted.chosen_layers


def demo_plan(model="all", steps=None, image_size=64, batch_size=16):
    """The demo's runs in training order: `[(run, what trains, why, train(log_dir, verbose))]`.

    The small models come first, so their runs can be looked at while
    ResNet50 trains; `steps` (None: each run's own default) applies to the
    small CNNs and ResNet50, not to the plain CNNs nor to the transformer and
    the diverging run (whose lengths are what a warning needs: a baseline of
    50 steps or more, then the divergence).
    """
    plan = []
    step_arg = {} if steps is None else {"steps": steps}
    if model in ("cnn", "all"):
        for pooling in ("max", "average"):
            plan.append(
                (
                    f"cnn_{pooling}pool",
                    f"a small CNN with {pooling} pooling (32 px)",
                    "to compare how max and average pooling route the gradient "
                    "(its ReLU layers also have dead channels, which check flags)",
                    functools.partial(train_small_cnn, pooling=pooling, **step_arg),
                )
            )
        plan += [
            (
                "plain_sigmoid",
                f"a plain {PLAIN_DEPTH}-layer CNN of sigmoids (16 px)",
                "its gradient vanishes toward the input, which check flags",
                functools.partial(train_plain_cnn, activation="sigmoid"),
            ),
            (
                "plain_relu_bn",
                f"the same {PLAIN_DEPTH} layers with BatchNorm and ReLU",
                "the healthy comparison: its gradient keeps flowing",
                functools.partial(train_plain_cnn, activation="relu_bn"),
            ),
        ]
        # The same CNN in mixed_float16, its loss scaled as Keras scales it and not scaled.
        plan += [
            (
                "mixed_float16_scaled",
                "the small max-pool CNN in mixed_float16, its loss scaled as Keras scales it",
                "its float16 gradients stay in float16's normal range",
                functools.partial(train_mixed_cnn, loss_scale=None),
            ),
            (
                "mixed_float16_unscaled",
                "the same CNN in mixed_float16 with the loss scale fixed at 1",
                "check flags its float16 gradients' underflow (most values subnormal), but "
                "none reaches zero, and in this short run its loss stays within a few "
                "thousandths of the scaled run's: the flag warns before training suffers",
                functools.partial(train_mixed_cnn, loss_scale=1.0),
            ),
        ]
    if model in ("divergence", "all"):
        start, ramp = divergence_cases.RAMP_START, 1.05
        plan += [
            (
                "transformer",
                "a 2-block transformer (MultiHeadAttention, LayerNormalization) on generated "
                "token sequences, Adam(1e-3)",
                "healthy: no flag and no warning, beside the run that diverges",
                train_transformer,
            ),
            (
                DIVERGING_RUN,
                "a 4-layer ReLU network in mixed_float16 without loss scaling, its SGD "
                f"learning rate growing {ramp - 1:.0%} per step from step {start}",
                "it diverges: its updates grow, then spike (the update_growth and "
                "update_spike warnings), tens of steps before its float16 gradients overflow "
                "to Inf and the next update turns its weights to NaN (nonfinite), where "
                "stop_on ends it",
                functools.partial(train_diverging_mlp, ramp=ramp),
            ),
        ]
    if model in ("resnet50", "all"):
        plan.append(
            (
                "resnet50",
                f"ResNet50 (weights=None, {image_size} px, batch {batch_size})",
                "its max pool pool1_pool, average pool and stage outputs",
                functools.partial(
                    train_resnet50, image_size=image_size, batch_size=batch_size, **step_arg
                ),
            )
        )
    return plan


def run_demo(logdir, model="all", steps=None, image_size=64, batch_size=16, verbose=1, say=None):
    """Writes the demo runs into `logdir`, in `demo_plan`'s order; returns `{run: [layer paths]}`.

    `model` is "resnet50", "cnn", "divergence" or "all". The CNN demo writes two runs,
    max and average pooling, so the GradViz tab can overlay them, and two
    20-layer plain CNNs, sigmoid and ReLU with BatchNorm, whose gradient
    flow and health flags show a vanishing gradient next to a healthy one,
    with their weights (`weights=True`), and the small CNN in mixed_float16
    with and without loss scaling, whose precision records and `underflow`
    flags show the float16 gradients underflowing without it. The
    divergence demo writes a healthy transformer and `DIVERGING_RUN`, whose
    warnings come before its failure flag.

    Args:
      say: None, or a function given a line of text before each run trains
        (which model and why) and after it (the layers it logged).
    """
    say = say or (lambda text: None)
    plan = demo_plan(model, steps, image_size, batch_size)
    runs = {}
    for number, (run, what, why, train) in enumerate(plan, 1):
        say(f"[{number}/{len(plan)}] {run}: {what}; {why}.")
        runs[run] = train(os.path.join(logdir, run), verbose=verbose)
        say(f"      {run} logged {len(runs[run])} layers: {', '.join(runs[run])}")
    return runs
