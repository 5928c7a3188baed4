"""`GradVizCallback`: logs activations and gradients of chosen layers during `fit`."""

import keras

from tb_gradviz.capture import arguments, in_step, in_step_fit, loss_scale, probe, selection
from tb_gradviz.capture import budget as budget_module
from tb_gradviz.capture import stop_on as stop_on_module
from tb_gradviz.capture import weights as weights_module
from tb_gradviz.format import events, records
from tb_gradviz.format import full_records as full_records_module
from tb_gradviz.format import judgement as judgement_module
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
        `DataLoader`, or any iterable of batches that can be read again. A
        one-shot iterator (a generator, say) is refused: taking its first
        batch would take it from training too.
      layers: None for every pooling layer (Max/Average/Global, 1D/2D/3D,
        inside nested models too), or a layer name, a path from the model
        (`"resnet50/pool1_pool"`), a glob pattern on paths
        (`"resnet50/conv*_out"`), a layer instance (`model.get_layer("pool")`,
        or a layer of a nested model), a layer class, a predicate
        `layer -> bool`, or a list of those.
      every_n_epochs: log at the end of every N-th epoch, counting the epochs
        of every `fit` this callback is passed to. Default 1.
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
      stop_on: stop training after a log event that raised any of these flags
        or warnings (a name or a list of names: `nonfinite`, ...,
        `rms_growth`, ..., docs/health.md), judged at capture time by the
        rules `/onset` and `tb-gradviz check` apply; or a callable, called
        after each event that raised any, with the list of what it raised
        (each `{"flag", "class", "step", "layer", "tensor"}`, `class` "flag"
        or "warning"), that returns True to stop. A message names what was
        raised; `stopped_on` keeps the list.
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
        (`budget.Budget`, docs/costs.md). What it measured holds across
        repeated `fit` calls with the same callback. Each log event records
        the interval used and the measured share. Without a budget, a
        warning says once when logging passes 10 % of training time.
      full_records: which log events write their full records (histograms,
        stats, precision, routing, units, routing maps, updates); every event
        writes its digest, which the flags, the onset and the time views
        read. An int N (default 100): every event of the first N, then at
        spacings of 1, 2, 3, ... events, about sqrt(2 x events) more; and
        always at an event where a flag is first raised and the event before
        it (`full_records.Keeper`, docs/FORMAT.md). "all" keeps every event.
      block_formats: write each precision record's block part (what MXFP8,
        MXFP6, MXFP4 and NVFP4 would do to the tensor, docs/FORMAT.md): True,
        False, or None (default): where cheap or to the point, every chosen
        layer a pooling layer or one computing in 16 or 8 bits
        (`selection.block_formats_for`; costs: bench/RESULTS.md section 20).
      digest: where each log event's digest is computed. "probe" (the
        default): from the probe pass's records. "step": on TensorFlow, JAX
        and PyTorch, by the train step itself, from that step's batch, in the backward pass
        that computes the weight gradients (`in_step_fit`, docs/probe.md),
        with the update ratio of every trainable weight of the model over
        that step, which the update warnings read without `weights=True`;
        the probe still runs at the events whose full records are kept
        (`full_records`) and at `log_now()`. Needs `every_n_batches`; not
        yet with `weights=True`. Elsewhere (a model with its own
        `train_step`, `jit_compile` on TensorFlow or PyTorch, several
        replicas, a `keras.distribution`, docs/probe.md) a message says so
        once and the probe's digest is kept.

    Raises:
      TypeError: an argument's type is not one allowed.
      ValueError: an argument's value is not one allowed. Messages say what
        is allowed and end "Received: <argument>=...". What depends on the
        model (layer names, the probe's shapes, a loss) is checked when
        training starts, before the first step.
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
        stop_on=None,
        routing_map=True,
        routing_map_example=0,
        routing_map_channels=None,
        routing_map_origin=None,
        weights=False,
        budget=None,
        full_records=full_records_module.DEFAULT_FIRST,
        block_formats=None,
        digest=in_step.PROBE,
    ):
        super().__init__()
        location = arguments.check_log_dir(log_dir)
        self.every_n_epochs, self.every_n_batches = arguments.check_frequency(
            every_n_epochs, every_n_batches
        )
        if self.every_n_batches is not None:
            # Defining a batch hook makes Keras wait for every batch; do it
            # only when batch frequency is asked for.
            self.on_train_batch_end = self._on_train_batch_end
        self.log_dir = location.url
        self.layers = selection.check_layer_spec(layers)
        self.loss = None if loss is None else selection.as_loss(loss)
        self.training = arguments.check_bool("training", training)
        self.stop_on_nonfinite = arguments.check_bool("stop_on_nonfinite", stop_on_nonfinite)
        self._stop_on = stop_on_module.StopOn(*arguments.check_stop_on(stop_on))
        # Each event judged once, for the keeper and stop_on; the warnings only when asked.
        self._judge = judgement_module.Judge(warnings=self._stop_on.active)
        map_settings = routing_map_module.Settings(
            routing_map_example, routing_map_channels, routing_map_origin
        )
        self.routing_map = (
            map_settings if arguments.check_bool("routing_map", routing_map) else None
        )
        self.weights = arguments.check_bool("weights", weights)
        self.block_formats = arguments.check_block_formats(block_formats)
        # The one owner of the log schedule: units passed, the interval, when to log.
        self._budget = budget_module.Budget(
            budget, asked=self.every_n_batches or self.every_n_epochs
        )
        # Which events write their full records: the schedule, the flags seen, the held event.
        self._keeper = full_records_module.Keeper(full_records_module.check_first(full_records))
        self.digest = in_step.check_digest(digest)
        # digest="step": which events run the probe (the full records' schedule, followed
        # here, the keeper writing each probe event whole), and the in-step train step.
        self._full_first, self._in_step_events, self._in_step = self._keeper.first, 0, None
        if self.digest == in_step.STEP:
            in_step.check_step_arguments(self.every_n_batches, self.weights)
            self._keeper = full_records_module.Keeper(None)
        # Last: a source's first batch is read only once every other argument is valid.
        self._probe = arguments.probe_batch(probe_data)
        self._log = events.EventLog(location)
        self._capture = None
        self._updates = None
        self.stopped_on = None  # what the log event that stopped training raised (stop_on)
        self._train_function = None
        # The batches fit ran and the optimizer steps applied, for the loss-scale record.
        self._batch_count = loss_scale.BatchCount()

    @property
    def chosen_layers(self):
        """Paths of the layers being logged (known once training has begun)."""
        return [] if self._capture is None else [c.path for c in self._capture.chosen]

    def on_train_begin(self, logs=None):
        capture = self._capture
        self._build()
        if self.digest == in_step.STEP:
            self._in_step = in_step_fit.install(
                self.model, self._capture.chosen, self._in_step_due, self._in_step
            )
        # Keras makes the train function before this hook, and again only when the model
        # is compiled again: a new one compiles in the first steps of this fit.
        train_function = getattr(self.model, "train_function", None)
        rebuilt = self._capture is not capture or train_function is not self._train_function
        self._train_function = train_function
        # Batches are counted by the optimizer's iterations (Keras calls the batch
        # hook once per `steps_per_execution` steps), epochs by the budget itself.
        position = self._step() if self.every_n_batches is not None else None
        self._budget.begin_fit(position, rebuilt=rebuilt)
        self._batch_count.begin_fit(self._step())

    def _build(self):
        """Builds the probe pass, once per model."""
        if self._capture is None or self._capture.model is not self.model:
            chosen = selection.select_layers(self.model, self.layers)
            arguments.check_loss(self.model, self.loss)
            arguments.check_probe_inputs(self.model, self._probe[0])
            arguments.check_probe_targets(self.model, self.loss, *self._probe)
            if self.routing_map is not None:
                examples = len(keras.tree.flatten(self._probe[0])[0])
                if self.routing_map.example >= examples:
                    raise ValueError(
                        f"routing_map_example must be below the probe batch's size, {examples}. "
                        f"Received: routing_map_example={self.routing_map.example}"
                    )
            self._capture = probe.new_capture(
                self.model,
                chosen,
                loss=self.loss,
                training=self.training,
                routing_map=self.routing_map,
                weights=self.weights,
                block_formats=selection.block_formats_for(chosen, self.block_formats),
            )
            self._updates = weights_module.Updates() if self.weights else None

    def on_epoch_end(self, epoch, logs=None):
        # Without a batch hook the epoch's batches are the steps fit announced for it.
        by_epoch = self.every_n_batches is None
        self._batch_count.epoch_ended((self.params or {}).get("steps") if by_epoch else 0)
        if self.every_n_epochs is not None:
            self._budget.passed(1)
            if self._budget.due:
                self.log_now()

    def _on_train_batch_end(self, batch, logs=None):
        self._batch_count.batch_ended(batch)
        self._budget.passed(self._step() - self._budget.position)
        if self._budget.due and not self._log_in_step():
            self.log_now()

    def _in_step_due(self):
        """Whether the train function's next call ends at a log event: the step computes its
        statistics, and every weight's update, which a probe event's digest takes too."""
        return self._budget.due_after(self.model.steps_per_execution)

    def _log_in_step(self):
        """Writes a due log event from the train step's statistics; False leaves it to the probe
        (the event's full records are kept, or its step computed none)."""
        if self._in_step is None:
            return False
        full = full_records_module.scheduled(self._in_step_events, self._full_first)
        self._in_step_events += 1
        step = self._step()
        if full:
            return False  # the probe's event, whose digest takes the step's updates
        taken = self._in_step.take(step)
        if taken is None:
            return False
        self._budget.log_started()
        written = in_step_fit.event_records(taken, self._in_step.layout)
        self._budget.log_ended()
        written += self._budget.records() + loss_scale.records(self.model, self._batch_count)
        raised_before = set(self._keeper.raised)
        judgement = self._judge.judge(step, written)
        if self._writes_summaries():
            for at, kept, wall_time in self._keeper.writes(step, written, judgement):
                self._log.write(at, kept, wall_time=wall_time, add_digest=False)
            if judgement.flags - raised_before:
                self._write_onset_records(step)
        if self.stop_on_nonfinite:
            self._stop_on_nonfinite(step, self._in_step.layout.nonfinite(taken["rows"]))
        self._stop_if_asked(step, judgement)
        return True

    def _write_onset_records(self, step):
        """Writes the full records of the probe at `step`, an in-step event that first raised a
        flag: the onset has its full records, as an event of its own after the digest (the
        event before it has none to keep, its digest being the step's)."""
        full_event, skipped = self._capture.run(*self._probe)
        self._capture.take_host_weights()
        probe.warn_skipped(skipped)
        full = [r for r in full_event if not full_records_module.always_written(r)]
        self._log.write(step, full, add_digest=False)

    def on_train_end(self, logs=None):
        in_step_fit.uninstall(self._in_step)
        self._budget.end_fit()
        self._batch_count.end_fit(self._step())
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

        Raises:
          TypeError, ValueError: `step` is not an integer >= 0 (checked
            before the pass runs).
        """
        if step is not None:
            step = arguments.check_step(step)
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
        if self._in_step is not None:
            written = in_step_fit.probe_event_records(written, self._in_step, self._step())
        host_weights = self._capture.take_host_weights()
        probe.warn_skipped(skipped)
        step = self._step() if step is None else step
        if self._updates is not None:
            written += self._updates.records(self._capture.plans, step, host_weights)
        self._budget.log_ended()
        written += self._budget.records()
        written += loss_scale.records(self.model, self._batch_count)
        judgement = self._judge.judge(step, written)
        for at, kept, wall_time in self._keeper.writes(step, written, judgement):
            self._log.write(at, kept, wall_time=wall_time, add_digest=False)
        if self.stop_on_nonfinite:
            self._stop_on_nonfinite(step, records.nonfinite_stats_tags(written))
        self._stop_if_asked(step, judgement)

    def _stop_on_nonfinite(self, step, names):
        if names:
            named = ", ".join(names)
            print(
                f"GradVizCallback: step {step}: NaN or Inf recorded in {named}; stopping training"
            )
            self.model.stop_training = True

    def _stop_if_asked(self, step, judgement):
        if self._stop_on.stops(judgement):
            self.stopped_on = self._stop_on.stop(self.model, step, judgement)

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
                "pass log_now(step=...). Received: step=None"
            )
        return int(keras.ops.convert_to_numpy(optimizer.iterations))
