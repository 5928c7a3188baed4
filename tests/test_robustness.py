"""Interrupted training, probes that do not fit the model, arguments test_callback leaves out."""

import os
import re
import struct

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import eventdata  # noqa: E402

from tb_gradviz import GradVizCallback  # noqa: E402
from tb_gradviz.format import records  # noqa: E402

layers = keras.layers


def cnn(input_shape=(8, 8, 3)):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input(input_shape),
            layers.Conv2D(4, 3, padding="same", name="conv"),
            layers.MaxPooling2D(name="pool"),
            layers.GlobalAveragePooling2D(name="gap"),
            layers.Dense(2, name="dense"),
        ],
        name="cnn",
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def data(n=16, size=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, size, size, 3)).astype("float32"), rng.normal(size=(n, 2)).astype(
        "float32"
    )


def tfrecord_lengths(path):
    """Lengths of the records of a TFRecord file; fails on a partial record.

    Each record is a uint64 length, a 4-byte CRC, the data and a 4-byte CRC.
    """
    lengths = []
    with open(path, "rb") as f:
        content = f.read()
    offset = 0
    while offset < len(content):
        assert offset + 12 <= len(content), "partial record header"
        (length,) = struct.unpack("<Q", content[offset : offset + 8])
        assert offset + 12 + length + 4 <= len(content), "partial record"
        lengths.append(length)
        offset += 12 + length + 4
    return lengths


class InterruptAt(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch
        self.train_end_calls = 0

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            raise KeyboardInterrupt

    def on_train_end(self, logs=None):
        self.train_end_calls += 1


def test_keyboard_interrupt_leaves_every_written_event_readable(tmp_path):
    model = cnn()
    x, y = data(32)
    gradviz = GradVizCallback(tmp_path, (x[:4], y[:4]), every_n_batches=1)
    interrupt = InterruptAt(batch=2)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[gradviz, interrupt])
    # Keras 3 does not call on_train_end when fit is interrupted: the file
    # stays open, and every event was flushed when it was written.
    assert interrupt.train_end_calls == 0
    files = [f for f in os.listdir(tmp_path) if ".tfevents." in f]
    assert len(files) == 1
    lengths = tfrecord_lengths(tmp_path / files[0])
    assert len(lengths) == 1 + 3  # the file_version event, then steps 1, 2, 3
    log = eventdata.load(tmp_path)
    tags = eventdata.tensor_tags(log)
    # Two pooling layers: 3 tensors x 3 records (histogram, stats, precision), routing, units,
    # routing map; and the digest.
    assert len(tags) == 2 * (3 * 3 + 3) + 1
    for tag in tags:
        assert [s for s, _ in eventdata.values(log, tag)] == [1, 2, 3], tag

    # The same callback carries on in the next fit, in the same file.
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[gradviz])
    assert os.listdir(tmp_path) == files
    log = eventdata.load(tmp_path)
    assert [s for s, _ in eventdata.values(log, records.stats_tag("pool", "activation"))] == list(
        range(1, 12)
    )


def test_probe_of_the_wrong_size_fails_at_fit_start_naming_both_shapes(tmp_path):
    model = cnn()
    x, y = data(8)
    probe, _ = data(4, size=9)
    message = (
        r"probe_data x does not fit model 'cnn': it expects shape \(None, 8, 8, 3\) "
        r"\(None: any size\)\. Received: probe_data x of shape \(4, 9, 9, 3\)"
    )
    with pytest.raises(ValueError, match=message):
        model.fit(x, y, verbose=0, callbacks=[GradVizCallback(tmp_path, (probe, y[:4]))])
    assert int(model.optimizer.iterations.numpy()) == 0  # before any training step
    with pytest.raises(ValueError, match=r"expects shape \(None, 8, 8, 3\).*of shape \(4, 8, 8\)"):
        model.fit(x, y, verbose=0, callbacks=[GradVizCallback(tmp_path, (x[:4, ..., 0], y[:4]))])
    with pytest.raises(
        ValueError, match=r"must hold 1 input\(s\) for model 'cnn'\. Received: probe_data x with 2"
    ):
        model.fit(x, y, verbose=0, callbacks=[GradVizCallback(tmp_path, ([x[:4], x[:4]], y[:4]))])
    assert not os.listdir(tmp_path)


def test_multi_input_probe_is_matched_by_name(tmp_path):
    keras.utils.set_random_seed(0)
    a, b = keras.Input((6,), name="a"), keras.Input((3,), name="b")
    joined = layers.Concatenate(name="join")([a, b])
    model = keras.Model({"a": a, "b": b}, layers.Dense(1)(joined), name="two")
    model.compile("sgd", "mse")
    rng = np.random.default_rng(0)
    x = {
        "a": rng.normal(size=(4, 6)).astype("float32"),
        "b": rng.normal(size=(4, 3)).astype("float32"),
    }
    y = np.ones((4, 1), "float32")
    with pytest.raises(
        ValueError, match=r"no input named 'b'.*Received: probe_data x, a dict with keys \['a'\]"
    ):
        model.fit(
            x,
            y,
            verbose=0,
            callbacks=[GradVizCallback(tmp_path, ({"a": x["a"]}, y), layers="join")],
        )
    swapped = {"a": x["b"], "b": x["a"]}
    with pytest.raises(
        ValueError, match=r"x 'a' does not fit.*expects shape \(None, 6\).*'a' of shape \(4, 3\)"
    ):
        model.fit(
            x, y, verbose=0, callbacks=[GradVizCallback(tmp_path, (swapped, y), layers="join")]
        )
    model.fit(x, y, verbose=0, callbacks=[GradVizCallback(tmp_path, (x, y), layers="join")])
    assert eventdata.layers(eventdata.load(tmp_path)) == ["join"]


def test_free_input_size_accepts_a_probe_of_another_size(tmp_path):
    model = cnn(input_shape=(None, None, 3))
    x, y = data(8)
    probe_x, probe_y = data(2, size=12)
    model.fit(x, y, verbose=0, callbacks=[GradVizCallback(tmp_path, (probe_x, probe_y))])
    log = eventdata.load(tmp_path)
    assert eventdata.content(log, records.stats_tag("pool", "input_gradient"))["shape"] == [
        2,
        12,
        12,
        4,
    ]


def test_loss_given_by_name_takes_sample_weight(tmp_path):
    # keras.losses.get("mse") is a plain function without sample_weight;
    # the callback used to pass it one.
    x, y = data(8)
    weights = np.linspace(0, 1, 8).astype("float32")
    logs = {}
    for name, loss in (("by_name", "mse"), ("by_object", keras.losses.MeanSquaredError())):
        model = cnn()
        model.fit(
            x,
            y,
            verbose=0,
            callbacks=[GradVizCallback(tmp_path / name, (x, y, weights), loss=loss)],
        )
        logs[name] = eventdata.load(tmp_path / name)
    tags = eventdata.tensor_tags(logs["by_name"])
    assert tags == eventdata.tensor_tags(logs["by_object"])
    for tag in tags:
        np.testing.assert_array_equal(
            eventdata.last(logs["by_name"], tag), eventdata.last(logs["by_object"], tag)
        )


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"log_dir": 3}, TypeError, "log_dir must be a path (str or os.PathLike); received 3"),
        ({"log_dir": ""}, ValueError, "log_dir must be a non-empty path; received ''"),
        (
            {"every_n_batches": -1},
            ValueError,
            "every_n_batches must be a positive integer. Received: every_n_batches=-1",
        ),
        (
            {"every_n_batches": True},
            TypeError,
            "every_n_batches must be a positive integer. Received: every_n_batches=True",
        ),
        (
            {"every_n_epochs": None},
            ValueError,
            "every_n_epochs=None logs only with every_n_batches; pass one of them. "
            "Received: every_n_epochs=None, every_n_batches=None",
        ),
        ({"loss": 3}, TypeError, "a function (y_true, y_pred) or a Loss. Received: loss=3"),
        (
            {"loss": "qx"},
            ValueError,
            "(Could not interpret loss identifier: qx). Received: loss='qx'",
        ),
        ({"layers": [None]}, TypeError, "Received: layers=[None], holding None of type NoneType"),
        (
            {"probe_data": (None, np.ones((2, 2)))},
            ValueError,
            "must hold both x and y. Received: x=NoneType",
        ),
    ],
)
def test_more_bad_arguments_say_what_was_received(tmp_path, kwargs, error, message):
    x, y = data(2)
    arguments = {"log_dir": tmp_path, "probe_data": (x, y), **kwargs}
    with pytest.raises(error, match=re.escape(message)):
        GradVizCallback(**arguments)


def test_log_dir_below_a_file_fails_before_training(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    x, y = data(2)
    with pytest.raises(
        ValueError,
        match=r"cannot be created inside '.*file', a file\. Received: log_dir='.*file/run/1'",
    ):
        GradVizCallback(a_file / "run" / "1", (x, y))


def test_dataset_of_x_only_says_what_its_element_is(tmp_path):
    x, _ = data(4)
    with pytest.raises(
        TypeError,
        match=r"first batch of probe_data \(a tf.data.Dataset\) must be \(x, y\).*Received: ",
    ):
        GradVizCallback(tmp_path, tf.data.Dataset.from_tensor_slices(x).batch(2))
