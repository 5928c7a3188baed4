"""`StepScalars`: the demos' per-step training loss and accuracy, as TensorBoard scalars."""

import time

import keras
from tensorboard.compat.proto import event_pb2, summary_pb2

from tb_gradviz.format import events


class StepScalars(keras.callbacks.Callback):
    """Writes each training step's loss and accuracy as TensorBoard scalars into `log_dir`.

    Not Keras' `TensorBoard(update_freq=1)`: that one writes into
    `log_dir/train`, a run apart from the GradViz run, and writes the
    epoch's running mean, which lags behind the steps. These go into the
    GradViz run's own directory, so the Scalars dashboard names the same runs
    as the GradViz tab, through tb_gradviz's own event file writer
    (`events.EventFile`), without TensorFlow. The run then holds two event
    files: the demo serves once both are complete, since TensorBoard's Python
    loader follows only the newest file of a run that is still being written.

    A model compiled without an accuracy metric gets its loss only.
    """

    TAGS = {"loss": "train/loss", "accuracy": "train/accuracy"}

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir
        self._writer = None
        self._means = {}

    def on_train_batch_end(self, batch, logs=None):
        if self._writer is None:
            self._writer = events.EventFile(self.log_dir, suffix=".scalars")
        values = []
        for name, tag in self.TAGS.items():
            if name not in logs:
                continue
            # Keras' logs hold the mean over the epoch's first `batch + 1`
            # batches; the demo's batches are all full, so this batch's own
            # value is what that mean gained.
            mean = float(logs[name])
            value = (batch + 1) * mean - batch * self._means.get(name, 0.0)
            self._means[name] = mean
            values.append(summary_pb2.Summary.Value(tag=tag, simple_value=value))
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        event = event_pb2.Event(
            wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)
        )
        self._writer.write(event.SerializeToString())
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
