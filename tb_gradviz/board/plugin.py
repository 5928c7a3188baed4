"""The tb_gradviz TensorBoard plugin: serves the "GradViz" tab and its data.

Imports neither TensorFlow nor Keras: TensorBoard imports every installed
plugin at start, and one failing import stops TensorBoard. Data is read only
through `context.data_provider` (`store`), so both loaders work (the Python
multiplexer with `--load_fast=false` and the Rust data server); the answers
are built by `responses`; `routes` reads the requests and serves the
static files. The HTTP API is described in docs/API.md, the
records it reads in docs/FORMAT.md.
"""

from tensorboard import errors
from tensorboard.plugins import base_plugin
from tensorboard.plugins.histogram import metadata as histogram_metadata

from tb_gradviz.board import (
    health,
    onset,
    query,
    responses,
    routes,
    series,
    snapshot,
    store,
    timeline,
)
from tb_gradviz.format import digest, metadata, records


def _series_by_kind(layers, read):
    """`{"stats" | "routing" | "units" | "updates" | "precision": {tag: Series}}` of a run's layers.

    `read(time_series_by_tag, layout)`: how each kind is read (whole, or up to a step).
    """

    def listed(kind):
        return {layer[kind][0]: layer[kind][2] for layer in layers.values() if layer[kind]}

    return {
        "stats": read(
            {tag: ts for layer in layers.values() for tag, _, ts in layer["tensors"].values()},
            records.STATS,
        ),
        "routing": read(listed("routing"), records.ROUTING),
        "units": read(listed("units"), records.UNITS),
        "updates": read(
            {tag: ts for layer in layers.values() for tag, _, ts in layer["updates"].values()},
            records.UPDATE,
        ),
        "precision": read(
            {tag: ts for layer in layers.values() for tag, _, ts in layer["precision"].values()},
            records.PRECISION,
        ),
    }


def _at_or_before(found, step, missing):
    """`found` (a `series.Series`) whole when `step` is None, else its latest row at `<= step`.

    Raises:
      NotFoundError: `f"{missing} <= {step}"`, when it has no such row.
    """
    if step is None:
        return found
    row = found.index_at_or_before(step)
    if row is None:
        raise errors.NotFoundError(f"{missing} <= {step}")
    return found.row(row)


class GradVizPlugin(base_plugin.TBPlugin):
    """Serves the GradViz tab: per-layer activations and gradients over steps."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context, frontend_dir=None):
        """Instantiates the plugin; TensorBoard calls it with its context.

        Args:
          context: a `base_plugin.TBContext`; only `data_provider` is used.
          frontend_dir: the folder of the static files; defaults to the
            installed `tb_gradviz.board.frontend` package (tests pass their own).
        """
        self._data_provider = context.data_provider
        self._caches = series.Caches()
        self._encodings = routes.Encodings()
        self._serve_static = routes.static_route(
            frontend_dir if frontend_dir is not None else routes.frontend_dir()
        )

    def get_plugin_apps(self):
        json_route = routes.json_route
        return {
            "/runs": json_route(self.runs_impl),
            "/series": json_route(self.series_impl, ("run", "layer", "tensor"), ("width", "step")),
            "/routing": json_route(self.routing_impl, ("run", "layer"), ("step",)),
            "/step": json_route(self.step_impl, ("run",), ("step", "ratio")),
            "/routing_map": json_route(self.routing_map_impl, ("run", "layer"), ("step",)),
            "/updates": json_route(self.updates_impl, ("run", "layer")),
            "/timeline": json_route(
                self.timeline_impl,
                ("run",),
                ("field", "role", "width", "ratio"),
                encodings=self._encodings,
            ),
            "/onset": json_route(self.onset_impl, ("run",), ("ratio",)),
            routes.STATIC_ROUTE + "/*": self._serve_static,
        }

    def is_active(self):
        """Returns False: the tab is active exactly when the provider has `gradviz` data.

        TensorBoard asks this only when `list_plugins` does not name one of
        `data_plugin_names()`, i.e. when the logdir holds no tb_gradviz records.
        """
        return False

    def data_plugin_names(self):
        # Not `histograms`: any logdir with Keras weight histograms has those.
        return (metadata.PLUGIN_NAME,)

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(
            es_module_path=routes.STATIC_ROUTE + "/index.js", tab_name="GradViz"
        )

    def _store(self, ctx, experiment, run=None):
        return store.RunStore(self._data_provider, self._caches, ctx, experiment, run)

    # Implementations: plain data in, plain data out (the CLI calls them too).

    def runs_impl(self, ctx, experiment):
        """Returns the `/runs` body: runs with tb_gradviz data and their layers.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.

        Returns:
          `{"runs": [{"run", "layers"}]}`, runs by name, layers by `layer_index`.
        """
        return responses.runs_body(self._store(ctx, experiment).list_runs())

    def series_impl(
        self, ctx, experiment, run, layer, tensor, width=timeline.DEFAULT_WIDTH, step=None
    ):
        """Returns the `/series` body: the steps the provider holds of one tensor.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run, layer, tensor: names as `/runs` gives them.
          width: the most columns over steps: a longer series is downsampled
            to each column's extremes; None sends every step.
          step: when given, only the latest step `<= step`.

        Returns:
          A dict as described in docs/API.md.

        Raises:
          NotFoundError: no such run, layer or tensor, or no step `<= step`.
        """
        run_store = self._store(ctx, experiment, run)
        content, stats_series, histogram_series = run_store.tensor(layer, tensor)
        histograms = None
        if histogram_series is not None:
            histogram_tag = content["histogram_tag"]
            histograms = run_store.read_later(
                {histogram_tag: histogram_series}, records.HISTOGRAM, histogram_metadata.PLUGIN_NAME
            )
        tag = records.stats_tag(layer, tensor)
        stats = run_store.read({tag: stats_series}, records.STATS)[tag]
        stats = _at_or_before(stats, step, f"{layer!r} {tensor!r} has no step")
        return responses.series_body(
            run, content, stats, histograms.result()[histogram_tag] if histograms else None, width
        )

    def routing_impl(self, ctx, experiment, run, layer, step=None):
        """Returns the `/routing` body: the routing records of a pooling layer.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run, layer: names as `/runs` gives them.
          step: when given, only the latest step `<= step`.

        Returns:
          A dict as described in docs/API.md.

        Raises:
          NotFoundError: no such run or layer, the layer is not a pooling layer,
            or it has no step `<= step`.
        """
        run_store = self._store(ctx, experiment, run)
        content, time_series = run_store.routing(layer)
        tag = records.routing_tag(layer)
        routing = run_store.read({tag: time_series}, records.ROUTING)[tag]
        routing = _at_or_before(routing, step, f"{layer!r} has no routing record at a step")
        return responses.routing_body(run, content, routing)

    def step_impl(self, ctx, experiment, run, step=None, ratio=health.DEFAULT_RATIO):
        """Returns the `/step` body: every layer of a run at its latest step `<= step`, flagged.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run: a run name.
          step: an int, or None for each layer's last step.
          ratio: the vanishing / exploding ratio of the flags (`health`).

        Returns:
          A dict as described in docs/API.md. Layers without a step `<= step`
          are left out.

        Raises:
          NotFoundError: no such run, or no layer has a step `<= step`.
        """
        run_store = self._store(ctx, experiment, run)
        layers = run_store.layers()
        limit = query.INT64_MAX if step is None else step
        series_by_kind = _series_by_kind(
            layers, lambda found, layout: run_store.read_at(found, layout, limit)
        )
        body = snapshot.step_body(run, layers, series_by_kind, limit, ratio)
        if body is None:
            where = "logged step" if step is None else f"step <= {step}"
            raise errors.NotFoundError(f"run {run!r} has no {where}")
        found = self._digest_columns(run_store, layers)
        if found is not None:
            onset.judge_step_from_digest(body, *found, limit, ratio)
        return body

    def _digest_columns(self, run_store, layers):
        """`(steps, columns)` of the run's digest (`onset.digest_columns`), or None without one."""
        steps, columns = onset.digest_columns(layers, onset.read_digests(run_store))
        return (steps, columns) if len(steps) and columns else None

    def onset_impl(self, ctx, experiment, run, ratio=health.DEFAULT_RATIO):
        """Returns the `/onset` body: where each flag was first raised in a run (`onset`).

        Raises:
          NotFoundError: no such run, or it has no logged step.
        """
        steps, columns, listed = self._judged_columns(ctx, experiment, run)
        body = onset.onset_body(run, steps, columns, ratio, listed)
        if body is None:
            raise errors.NotFoundError(f"run {run!r} has no logged step")
        return body

    def check_impl(self, ctx, experiment, run, ratio=health.DEFAULT_RATIO):
        """Returns what `tb-gradviz check` prints of a run: `(flags at the last step, onset)`.

        The first is `onset.last_step_body` from the run's digest, or the
        `/step` body at the last step for a run without one; the second the
        `/onset` body. Both judge the same columns, read once.

        Raises:
          NotFoundError: no such run, or it has no logged step.
        """
        steps, columns, listed, digested = self._judged_columns(ctx, experiment, run, True)
        last = (
            onset.last_step_body(run, steps, columns, ratio, listed)
            if digested
            else self.step_impl(ctx, experiment, run, None, ratio)
        )
        body = onset.onset_body(run, steps, columns, ratio, listed)
        if body is None or last is None:
            raise errors.NotFoundError(f"run {run!r} has no logged step")
        return last, body

    def _judged_columns(self, ctx, experiment, run, with_source=False):
        """`(steps, columns, listed)` that the flags of every step are judged from
        (`onset`): the digest's, or the full records' in a run without one."""
        run_store = self._store(ctx, experiment, run)
        layers = run_store.layers()
        found = self._digest_columns(run_store, layers)
        if found is None:
            result = onset.records_columns(layers, _series_by_kind(layers, run_store.read))
        else:
            result = (*found, onset.listed_dead_channels(run_store, layers))
        return (*result, found is not None) if with_source else result

    def timeline_impl(
        self,
        ctx,
        experiment,
        run,
        field="rms",
        role=records.OUTPUT_GRADIENT,
        width=timeline.DEFAULT_WIDTH,
        ratio=health.DEFAULT_RATIO,
    ):
        """Returns the `/timeline` body: every layer over every logged step, from the digest.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run: a run name.
          field, role, width, ratio: as `timeline.timeline_body` takes them.

        Returns:
          A dict as described in docs/API.md. The same object while the run's
          digest and budget series have no new point: callers do not change it.

        Raises:
          NotFoundError: no such run, or it has no digest (written before digests).
        """
        run_store = self._store(ctx, experiment, run)
        found = run_store.digests()
        budget = run_store.budget()
        key = (experiment, run, field, role, width, ratio)
        current = (
            tuple((tag, series.version(ts)) for tag, (_, ts) in found.items()),
            None if budget is None else series.version(budget[2]),
        )
        body = self._caches.bodies.get(key, current)
        if body is not None:
            return body
        # One body of a run at a time: the tab asks for several widths at once,
        # and a body holds arrays of every layer over every step while it is built.
        with self._caches.reading([("timeline", experiment, run)]):
            body = self._caches.bodies.get(key, current)
            if body is None:
                body = self._timeline_body(run_store, found, field, role, width, ratio)
                body["budget"] = self.budget_impl(ctx, experiment, run)
                self._caches.bodies.put(key, current, body)
        return body

    def _timeline_body(self, run_store, found, field, role, width, ratio):
        """Builds the `/timeline` body from the run's digest series `found` (`RunStore.digests`)."""
        run = run_store.run
        digests = [
            (rows, run_store.read({tag: ts}, timeline.digest_layout(rows), digest.PLUGIN_NAME)[tag])
            for tag, (rows, ts) in found.items()
        ]
        # Only the flush share needs each layer's compute dtype (its metadata, in the listing).
        dtypes = None
        if field == "flush_share":
            dtypes = {
                name: layer["info"].get("layer_dtype") for name, layer in run_store.layers().items()
            }
        body = timeline.timeline_body(run, digests, field, role, width, ratio, dtypes)
        if body is None:
            raise errors.NotFoundError(
                f"run {run!r} has no digest (it was written by a tb_gradviz without one)"
            )
        return body

    def budget_impl(self, ctx, experiment, run):
        """Returns the run's last cost-budget record (`timeline.budget_body`), or None without one.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run: a run name.
        """
        run_store = self._store(ctx, experiment, run)
        budget = run_store.budget()
        if budget is None:
            return None
        tag, fields, time_series = budget
        layout = timeline.budget_layout(fields)
        series = run_store.read({tag: time_series}, layout, digest.PLUGIN_NAME)[tag]
        return timeline.budget_body(fields, series)

    def updates_impl(self, ctx, experiment, run, layer):
        """Returns the `/updates` body: how far each weight of a layer moved between log events.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run, layer: names as `/runs` gives them.

        Returns:
          A dict as described in docs/API.md.

        Raises:
          NotFoundError: no such run or layer, or the layer has no update records.
        """
        run_store = self._store(ctx, experiment, run)
        found = run_store.updates(layer)
        by_tag = run_store.read(
            {tag: time_series for tag, _, time_series in found.values()}, records.UPDATE
        )
        return responses.updates_body(
            run, layer, {weight: by_tag[tag] for weight, (tag, _, _) in found.items()}
        )

    def precision_impl(self, ctx, experiment, run):
        """Returns every precision record of a run, decoded (`export` reads it).

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run: a run name.

        Returns:
          `{"run", "layers": {layer: {tensor: {"steps", "precision"}}}}`: per
          layer and tensor with records, its steps and at each the record as
          `/step` serves it (`records.decode_precision`). A layer without
          records (a run written before them) is left out.

        Raises:
          NotFoundError: no such run.
        """
        run_store = self._store(ctx, experiment, run)
        layers = run_store.layers()
        by_tag = run_store.read(
            {
                tag: time_series
                for layer in layers.values()
                for tag, _, time_series in layer["precision"].values()
            },
            records.PRECISION,
        )
        return responses.precision_body(
            run,
            {
                name: {tensor: by_tag[tag] for tensor, (tag, _, _) in layer["precision"].items()}
                for name, layer in layers.items()
                if layer["precision"]
            },
        )

    def routing_map_impl(self, ctx, experiment, run, layer, step=None):
        """Returns the `/routing_map` body: a pooling layer's map at its latest step `<= step`.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run, layer: names as `/runs` gives them.
          step: an int, or None for the last step.

        Returns:
          A dict as described in docs/API.md.

        Raises:
          NotFoundError: no such run or layer, no routing map, or no step `<= step`.
        """
        run_store = self._store(ctx, experiment, run)
        content, time_series = run_store.routing_map(layer)
        tag = records.routing_map_tag(layer)
        limit = query.INT64_MAX if step is None else step
        body = responses.routing_map_body(
            run, content, run_store.read({tag: time_series}, records.ROUTING_MAP)[tag], limit
        )
        if body is None:
            raise errors.NotFoundError(
                f"layer {layer!r} of run {run!r} has no routing map at a step <= {limit}"
            )
        return body
