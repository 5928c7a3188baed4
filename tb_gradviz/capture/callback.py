"""`GradVizCallback`: logs activations and gradients of chosen layers during `fit`."""

import os
import sys

import keras
import numpy as np

from tb_gradviz.capture import probe, selection
from tb_gradviz.capture import budget as budget_module
from tb_gradviz.capture import weights as weights_module
from tb_gradviz.format import events, metadata, records, storage
from tb_gradviz.format import routing_map as routing_map_module


class GradVizCallback(keras.callbacks.Callback):
    """Logs what flows forward and backward through chosen layers.

    On a fixed probe batch, at the chosen frequency, one extra compiled
    forward+backward pass records for each chosen layer the activation (its
    output), the gradient of the loss w.r.t. its input (through this layer
    only) and w.r.t. its output, as histograms and statistics, plus routing
    statistics for pooling layers. See docs/FORMAT.md. The pass never changes
    the training: weights, optimizer state, BatchNorm statistics, seed
    generators and metrics are left as they were.

    Under a `tf.distribute` strategy the whole probe batch runs on one device
    in cross-replica context, and only the chief writes. Under mixed
    precision, gradients are taken on the loss scaled by the optimizer's
    loss scale, as in `train_step`, and divided back in float64, so float16
    underflow shows as it happens in training.

    Example:
    ```python
    cb = tb_gradviz.GradVizCallback("logs/run1", probe_data=(x[:16], y[:16]))
    model.fit(x, y, epochs=5, callbacks=[cb])
    ```

    Args:
      log_dir: the run directory to write event files into (created when
        the first event is written): a local path, a `file://` URL, or a
        remote URL (`gs://bucket/run`, `s3://bucket/run`, any fsspec
        protocol), written through the file layer TensorBoard reads it with
        (docs/remote.md). Must not be an existing file.
      probe_data: the batch to measure: `(x, y)` or `(x, y, sample_weight)`
        (numpy arrays, tensors of any backend, or dicts/lists of them for
        multi-input models), or a source whose first batch is used: a
        `tf.data.Dataset`, a `keras.utils.PyDataset`, a PyTorch
        `DataLoader`, or any iterable of batches.
      layers: None for every pooling layer (Max/Average/Global, 1D/2D/3D,
        inside nested models too), or a layer name, a path from the model
        (`"resnet50/pool1_pool"`), a glob pattern on paths
        (`"resnet50/conv*_out"`), a layer class, a predicate
        `layer -> bool`, or a list of those.
      every_n_epochs: log at the end of every N-th epoch. Default 1.
      every_n_batches: log instead every N optimizer steps (then
        `every_n_epochs` must be left at its default or None). With
        `steps_per_execution` > 1, Keras ends a batch every that many steps:
        the callback logs at the first batch end at or after each multiple
        of N.
      loss: None to use the model's compiled loss, or a Keras loss.
      training: run the probe in training mode (BatchNorm batch statistics,
        Dropout on) like a train step; its state changes are undone.
      stop_on_nonfinite: stop training (`model.stop_training`, as Keras'
        `TerminateOnNaN` does for the loss) after a log event that recorded
        a NaN or an Inf in any activation or gradient; a message names them.
      routing_map: also record, for each pooling layer (3D: a depth slice), the
        routing map of one probe example (docs/FORMAT.md): its input, each window's
        winner, tied windows, and the gradients, for a few channels, within
        64 KiB per layer and event.
      routing_map_example: which probe example the maps show (default 0).
      routing_map_channels: None for the 4 channels that receive the most
        gradient, a count 1..8 of those, or a list of channel indices.
      routing_map_origin: None to centre a map too large for the budget, or
        the `(row, col)` input position its crop starts at.
      weights: also record, for each chosen layer with trainable weights
        (kernels, biases, BatchNorm gamma and beta), in the same pass: the
        gradient of the probe loss w.r.t. each weight and the weight's values
        (statistics and histograms, as for the other tensors), and from the
        second log event on the update size `|w - w_previous| / |w|` since the
        previous one (`weights.Updates`: it keeps one copy of those weights).
        Keras 2's `TensorBoard(write_grads=True)`, for Keras 3. Off by default.
      budget: None, or the share of training time logging may take (e.g.
        0.02): the callback times its log events against the training time
        between them and logs every whole multiple of the asked interval
        that keeps the share within it, never more often than asked
        (`budget.Budget`). Each log event records the interval used and the
        measured share. Without a budget, a warning says once when logging
        passes 10 % of training time.

    Raises:
      ValueError, TypeError: an argument is invalid; the message says what
        was received and what is allowed. Layer names are checked when
        training starts, against the model.
    """

    def __init__(
        self,
        log_dir,
        probe_data,
        layers=None,
        every_n_epochs=1,
        every_n_batches=None,
        loss=None,
        training=True,
        stop_on_nonfinite=False,
        routing_map=True,
        routing_map_example=0,
        routing_map_channels=None,
        routing_map_origin=None,
        weights=False,
        budget=None,
    ):
        super().__init__()
        # A URL is only parsed here, without touching the network: a store's
        # errors come at the first upload, and training goes on (upload.Uploader).
        location = storage.location(log_dir, "log_dir")
        log_dir = location.url
        if location.local_path is not None:
            _check_local_dir(location.local_path, log_dir)
        if every_n_batches is not None:
            _check_frequency("every_n_batches", every_n_batches)
            if every_n_epochs not in (1, None):
                raise ValueError(
                    "Pass either every_n_epochs or every_n_batches, not both; received "
                    f"every_n_epochs={every_n_epochs!r}, every_n_batches={every_n_batches!r}"
                )
            every_n_epochs = None
            # Defining a batch hook makes Keras wait for every batch; do it
            # only when batch frequency is asked for.
            self.on_train_batch_end = self._on_train_batch_end
        else:
            _check_frequency("every_n_epochs", every_n_epochs)
        if not isinstance(training, bool):
            raise TypeError(f"training must be True or False; received {training!r}")
        if not isinstance(stop_on_nonfinite, bool):
            raise TypeError(
                f"stop_on_nonfinite must be True or False; received {stop_on_nonfinite!r}"
            )
        if not isinstance(routing_map, bool):
            raise TypeError(f"routing_map must be True or False; received {routing_map!r}")
        if not isinstance(weights, bool):
            raise TypeError(f"weights must be True or False; received {weights!r}")
        map_settings = routing_map_module.Settings(
            routing_map_example, routing_map_channels, routing_map_origin
        )
        self.log_dir = log_dir
        self.layers = selection.check_layer_spec(layers)
        self.every_n_epochs = every_n_epochs
        self.every_n_batches = every_n_batches
        self.loss = None if loss is None else selection.as_loss(loss)
        self.training = training
        self.stop_on_nonfinite = stop_on_nonfinite
        self.routing_map = map_settings if routing_map else None
        self.weights = weights
        self._probe = probe_batch(probe_data)
        self._log = events.EventLog(location)
        self._capture = None
        self._updates = None
        self._logged_multiple = 0
        self._budget = budget_module.Budget(budget)

    @property
    def chosen_layers(self):
        """Paths of the layers being logged (known once training has begun)."""
        return [] if self._capture is None else [c.path for c in self._capture.chosen]

    def on_train_begin(self, logs=None):
        self._build()
        self._budget.begin_fit()
        if self.every_n_batches is not None:
            # Keras calls the batch hook once per `steps_per_execution` steps, so
            # the step is compared with the last multiple of N logged, not tested
            # for divisibility.
            self._logged_multiple = self._step() // self.every_n_batches

    def _build(self):
        """Builds the probe pass, once per model."""
        if self._capture is None or self._capture.model is not self.model:
            chosen = selection.select_layers(self.model, self.layers)
            if (
                self.loss is None
                and getattr(self.model, "_compile_loss", None) is None
                and not self.model.losses
            ):
                raise ValueError(
                    "GradVizCallback needs a loss: compile the model with one, or pass loss= "
                    "(a Keras loss name, function or Loss instance)"
                )
            check_probe_inputs(self.model, self._probe[0])
            if self.routing_map is not None:
                examples = len(keras.tree.flatten(self._probe[0])[0])
                if self.routing_map.example >= examples:
                    raise ValueError(
                        f"routing_map_example must be below the probe batch's size, {examples}; "
                        f"received {self.routing_map.example}"
                    )
            self._capture = probe.new_capture(
                self.model,
                chosen,
                loss=self.loss,
                training=self.training,
                routing_map=self.routing_map,
                weights=self.weights,
            )
            self._updates = weights_module.Updates() if self.weights else None

    def on_epoch_end(self, epoch, logs=None):
        if (
            self.every_n_epochs is not None
            and (epoch + 1) % self._budget.interval(self.every_n_epochs) == 0
        ):
            self.log_now()

    def _on_train_batch_end(self, batch, logs=None):
        multiple = self._step() // self._budget.interval(self.every_n_batches)
        if multiple > self._logged_multiple:
            self.log_now()
            # In multiples of the interval the budget decided at this log event.
            self._logged_multiple = self._step() // self._budget.interval(self.every_n_batches)

    def on_train_end(self, logs=None):
        self._log.close()

    def log_now(self, step=None):
        """Runs the probe pass and writes one log event.

        Called by `fit` at the chosen frequency; call it yourself to log from
        a custom training loop (after `set_model(model)`), on any backend.

        Args:
          step: the step to log at; None for the optimizer's iteration count.

        Under a `tf.distribute` multi-worker strategy only the chief writes.
        The pass runs on one device in cross-replica context and contains no
        collective op, so the other workers skip it; if a model ever made it
        contain one, every worker runs it (and all but the chief drop the
        result), since a collective that only some workers enter never
        completes. On JAX, only process 0 runs the pass and writes.
        """
        self._build()  # a custom loop calls set_model only
        x, y, sample_weight = self._probe
        if not self._writes_summaries():
            collective_ops = getattr(self._capture, "collective_ops", None)
            if collective_ops is not None and collective_ops(x, y, sample_weight):
                self._capture.run(x, y, sample_weight)
                self._capture.take_host_weights()
            return
        self._budget.log_started()
        written, skipped = self._capture.run(x, y, sample_weight)
        host_weights = self._capture.take_host_weights()
        probe.warn_skipped(skipped)
        step = self._step() if step is None else _check_step(step)
        if self._updates is not None:
            written += self._updates.records(self._capture.plans, step, host_weights)
        self._budget.log_ended()
        written += self._budget.records(self.every_n_batches or self.every_n_epochs or 0)
        self._log.write(step, written)
        if self.stop_on_nonfinite:
            nonfinite = [
                tag
                for tag, values, summary_metadata in written
                if _is_stats_record(summary_metadata) and records.stats_has_nonfinite(values)
            ]
            if nonfinite:
                print(
                    f"GradVizCallback: step {step}: NaN or Inf recorded in {', '.join(nonfinite)}; stopping training"
                )
                self.model.stop_training = True

    def _writes_summaries(self):
        backend = keras.backend.backend()
        if backend == "tensorflow":
            # False on the workers of MultiWorkerMirroredStrategy other than
            # the chief (Keras' own TensorBoard callback sends theirs to a
            # temporary directory; these write nothing).
            return bool(self.model.distribute_strategy.extended.should_save_summary)
        if backend == "jax":
            import jax

            return jax.process_index() == 0
        return True

    def _step(self):
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            raise ValueError(
                "log_now() needs a step: the model has no optimizer to count iterations; "
                "pass log_now(step=...)"
            )
        return int(keras.ops.convert_to_numpy(optimizer.iterations))


def _is_stats_record(summary_metadata):
    """Whether a written record is a tensor's stats record, by the kind its metadata gives."""
    plugin_data = summary_metadata.plugin_data
    return (
        plugin_data.plugin_name == metadata.PLUGIN_NAME
        and metadata.parse_plugin_metadata(plugin_data.content)["kind"] == metadata.KIND_TENSOR
    )


def _check_local_dir(path, log_dir):
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"log_dir must be a directory; received {log_dir!r}, which is a file")
    # Fail now rather than at the first log event, after training has run.
    ancestor = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(
            f"log_dir must be a directory; received {log_dir!r}, which cannot be created "
            f"inside {ancestor!r}, a file"
        )


def _check_step(step):
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step must be a non-negative integer; received {step!r}")
    return int(step)


def _check_frequency(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer; received {value!r}")


def check_probe_inputs(model, x):
    """Checks the probe's `x` against the inputs the model declares.

    Functional and Sequential models declare their inputs (`keras.Input`);
    dimensions given as None there (the batch, or a free image size) accept
    any size. Subclassed models declare none, and are not checked.

    Raises:
      ValueError: an input is missing, or has another rank or size than
        declared; the message gives the received and the expected shapes.
    """
    try:
        declared = model.inputs
    except AttributeError:
        return  # a subclassed model, or a Sequential one without an Input
    if isinstance(model, keras.Sequential) or len(declared) == 1:
        expected = [(None, declared[0])]
    elif isinstance(model.input, dict):
        expected = list(model.input.items())
    else:
        expected = [(t.name, t) for t in declared]

    if isinstance(x, dict) and expected[0][0] is not None:
        missing = [name for name, _ in expected if name not in x]
        if missing:
            raise ValueError(
                f"probe_data x has no input named {', '.join(map(repr, missing))} for model "
                f"{model.name!r}; received a dict with keys {sorted(x)}, expected keys {[n for n, _ in expected]}"
            )
        pairs = [(name, spec, x[name]) for name, spec in expected]
    else:
        received = keras.tree.flatten(x)
        if len(received) != len(expected):
            raise ValueError(
                f"probe_data x must hold {len(expected)} input(s) for model {model.name!r}; "
                f"received {len(received)}"
            )
        pairs = [(name, spec, t) for (name, spec), t in zip(expected, received)]

    for name, spec, tensor in pairs:
        want, got = tuple(spec.shape), tuple(tensor.shape)
        fits = len(want) == len(got) and all(w is None or w == g for w, g in zip(want[1:], got[1:]))
        if not fits:
            which = "" if name is None else f" {name!r}"
            raise ValueError(
                f"probe_data x{which} has shape {got}, which does not fit model {model.name!r}: "
                f"it expects {want} (None: any size)"
            )


def probe_batch(probe_data):
    """Returns `(x, y, sample_weight)` backend tensors from the callback's `probe_data`.

    `probe_data` is `(x, y)` or `(x, y, sample_weight)` (numpy arrays or
    tensors of any backend, or dicts/lists of them), or a source of such
    batches whose first batch is taken: a `tf.data.Dataset`, a
    `keras.utils.PyDataset`, a PyTorch `DataLoader` or any other iterable.

    Raises:
      ValueError: the data is not one of those, a source yields nothing, or
        the parts disagree on the batch size.
    """
    probe_data, source = _first_batch(probe_data)
    if not isinstance(probe_data, (tuple, list)) or len(probe_data) not in (2, 3):
        described = f"a {type(probe_data).__name__}"
        if isinstance(probe_data, (tuple, list)):
            described += f" of length {len(probe_data)}"
        raise ValueError(f"{source} must be (x, y) or (x, y, sample_weight); received {described}")
    x, y, *rest = probe_data
    sample_weight = rest[0] if rest else None
    if x is None or y is None:
        raise ValueError(
            f"{source} must hold both x and y; received x={type(x).__name__}, y={type(y).__name__}"
        )
    x, y = (keras.tree.map_structure(_as_tensor, part) for part in (x, y))
    if sample_weight is not None:
        sample_weight = _as_tensor(sample_weight)
    sizes = {
        int(t.shape[0])
        for t in keras.tree.flatten((x, y, sample_weight))
        if t is not None and len(t.shape) and t.shape[0] is not None
    }
    if len(sizes) > 1:
        raise ValueError(
            f"The parts of {source} must have the same batch size; received batch sizes {sorted(sizes)}"
        )
    if sizes == {0}:
        raise ValueError(f"{source} is empty (batch size 0); it needs at least one example")
    return x, y, sample_weight


def _first_batch(probe_data):
    """Returns `(batch, description)`: `probe_data` itself, or the first batch of a source of batches."""
    if (
        isinstance(probe_data, (tuple, list, dict))
        or keras.ops.is_tensor(probe_data)
        or isinstance(probe_data, np.ndarray)
    ):
        return probe_data, "probe_data"
    kind = _source_kind(probe_data)
    if kind is None:
        return probe_data, "probe_data"
    if isinstance(probe_data, keras.utils.PyDataset):
        batch = probe_data[0] if len(probe_data) else None
    else:
        batch = next(iter(probe_data), None)
    if batch is None:
        raise ValueError(f"probe_data is an empty {kind}; it must yield at least one (x, y) batch")
    return batch, f"the first batch of probe_data (a {kind})"


def _source_kind(probe_data):
    """Names the kind of batch source `probe_data` is, or None if it is none."""
    # Only a module the user has already imported can have made probe_data.
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(probe_data, tf.data.Dataset):
        return "tf.data.Dataset"
    if isinstance(probe_data, keras.utils.PyDataset):
        return "keras.utils.PyDataset"
    data = sys.modules.get("torch.utils.data")
    if data is not None and isinstance(probe_data, data.DataLoader):
        return "torch DataLoader"
    if hasattr(probe_data, "__iter__") and not isinstance(probe_data, (str, bytes)):
        return type(probe_data).__name__
    return None


def _as_tensor(t):
    # Tensors of another framework (a tf.data batch on JAX, say) pass through numpy.
    if not keras.ops.is_tensor(t) and hasattr(t, "numpy"):
        t = t.numpy()
    return keras.ops.convert_to_tensor(t)
