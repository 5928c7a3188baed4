"""The TensorFlow probe traces once per capture, and many captures in one process do not read as
retracing (TensorFlow's frequent-retracing warning)."""

import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tb_gradviz.capture import selection  # noqa: E402
from tb_gradviz.capture.backends import tensorflow as capture  # noqa: E402


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_captures_of_runs_one_after_another_raise_no_tf_function_retracing_warning():
    # The demo trains nine runs in one process, each with its own capture: TensorFlow counted
    # their one trace each under the method's code and warned "5 out of the last 17 calls to
    # LayerCapture._probe_fn triggered tf.function retracing".
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 6)).astype("float32")
    y = rng.normal(size=(4, 1)).astype("float32")
    lines = _Lines()
    logger = logging.getLogger("tensorflow")
    logger.addHandler(lines)
    traces = []
    try:
        for _ in range(7):
            model = keras.Sequential(
                [keras.Input((6,)), keras.layers.Dense(3, name="d"), keras.layers.Dense(1)]
            )
            model.compile("sgd", "mse")
            probe = capture.LayerCapture(model, selection.select_layers(model, ["d"]))
            for _ in range(2):
                records, _ = probe.run(x, y)
                assert records
            traces.append(probe._probe.experimental_get_tracing_count())
    finally:
        logger.removeHandler(lines)
    assert traces == [1] * 7  # traced once each, the second call reuses it
    assert not [line for line in lines.lines if "retracing" in line], lines.lines
