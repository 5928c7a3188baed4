"""The seed question, reproduced: what does TensorBoard show for a MaxPool layer?

Fits one small CNN with Keras' own `TensorBoard(histogram_freq=1)` callback and
with `GradVizCallback`, then lists, layer by layer, what each one wrote. Keras
logs weight histograms only, so the pooling layer gets nothing; `write_grads`,
which older answers suggest, is gone. tb_gradviz logs the pool's two tensors
(its output and the gradient w.r.t. its input) and the upstream gradient.

    python demo/keras_tensorboard_vs_gradviz.py [LOGDIR]
"""

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402

from tb_gradviz import GradVizCallback  # noqa: E402


def _tags(logdir):
    tags = []
    for root, _, files in os.walk(logdir):
        if any(".tfevents." in f for f in files):
            accumulator = event_accumulator.EventAccumulator(
                root, size_guidance={event_accumulator.TENSORS: 0}
            )
            accumulator.Reload()
            tags += accumulator.Tags()[event_accumulator.TENSORS]
    return tags


def compare(logdir):
    """Returns `{layer: (keras_tags, gradviz_tags)}` and the `write_grads` error."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(8, 3, activation="relu", name="conv"),
            keras.layers.MaxPooling2D(2, name="maxpool"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(2, name="dense"),
        ]
    )
    model.compile("adam", "mse")
    rng = np.random.default_rng(0)
    x, y = (
        rng.normal(size=(32, 16, 16, 3)).astype("float32"),
        rng.normal(size=(32, 2)).astype("float32"),
    )
    try:
        keras.callbacks.TensorBoard(os.path.join(logdir, "keras"), write_grads=True)
        write_grads_error = None
    except TypeError as e:
        write_grads_error = str(e)
    model.fit(
        x,
        y,
        epochs=1,
        verbose=0,
        callbacks=[
            keras.callbacks.TensorBoard(os.path.join(logdir, "keras"), histogram_freq=1),
            GradVizCallback(
                os.path.join(logdir, "gradviz"), (x[:8], y[:8]), layers=["conv", "maxpool", "dense"]
            ),
        ],
    )
    keras_tags, gradviz_tags = (
        _tags(os.path.join(logdir, "keras")),
        _tags(os.path.join(logdir, "gradviz")),
    )
    table = {}
    for layer in model.layers:
        table[layer.name] = (
            # Keras names weight histograms "<model>/<layer>/<weight>/histogram".
            sorted(t for t in keras_tags if layer.name in t.split("/")[:-1]),
            sorted(
                t
                for t in gradviz_tags
                if t.startswith(f"gradviz/{layer.name}/") and not t.endswith("/stats")
            ),
        )
    return table, write_grads_error


def main(argv):
    logdir = argv[1] if len(argv) > 1 else tempfile.mkdtemp(prefix="keras_vs_gradviz_")
    table, write_grads_error = compare(logdir)
    print(f"keras.callbacks.TensorBoard(write_grads=True) -> TypeError: {write_grads_error}\n")
    for layer, (keras_tags, gradviz_tags) in table.items():
        print(f"{layer}")
        print(f"  Keras TensorBoard(histogram_freq=1): {', '.join(keras_tags) or 'nothing'}")
        logged = ", ".join(gradviz_tags) or "nothing (not chosen)"
        print(f"  tb_gradviz:                          {logged}")
    print(f"\nLogs in {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
