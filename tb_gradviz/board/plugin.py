"""The tb_gradviz TensorBoard plugin: serves the "GradViz" tab and its data.

Imports neither TensorFlow nor Keras: TensorBoard imports every installed
plugin at start, and one failing import stops TensorBoard. Data is read only
through `context.data_provider` (`store`), so both loaders work (the Python
multiplexer with `--load_fast=false` and the Rust data server); the answers
are built by `responses`; `routes` reads the requests and serves the
static files. The route table is here, with the routes over a whole run;
the routes of one layer are `layer_impls`. The HTTP API is described in
docs/API.md, the records it reads in docs/FORMAT.md.
"""

import numpy as np
from tensorboard import errors
from tensorboard.plugins import base_plugin

from tb_gradviz.board import (
    catalog,
    columns,
    kept,
    layer_impls,
    levels,
    loss_scale,
    onset,
    query,
    routes,
    series,
    snapshot,
    timeline,
)
from tb_gradviz.format import digest, health, metadata, records, rule_columns


class GradVizPlugin(layer_impls.LayerImpls, base_plugin.TBPlugin):
    """Serves the GradViz tab: per-layer activations and gradients over steps."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context, frontend_dir=None):
        """Instantiates the plugin; TensorBoard calls it with its context.

        Args:
          context: a `base_plugin.TBContext`; only `data_provider` is used.
          frontend_dir: the folder of the static files; defaults to the
            installed `tb_gradviz.board.frontend` package (tests pass their own).
        """
        layer_impls.LayerImpls.__init__(self, context.data_provider)
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
                ("field", "role", "width", "ratio", "start", "end"),
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

    # Implementations of the routes over a whole run (those of one layer: `layer_impls`).

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
        series_by_kind = run_store.series_by_kind(layers, limit)
        body = snapshot.step_body(run, layers, series_by_kind, limit, ratio)
        if body is None:
            where = "logged step" if step is None else f"step <= {step}"
            raise errors.NotFoundError(f"run {run!r} has no {where}")
        found = self._digest_columns(run_store, layers)
        if found is not None:
            onset.judge_step_from_digest(body, *found, limit, ratio)
        return body

    def _digest_columns(self, run_store, layers, view=None):
        """The run's `columns.Columns` from its digest (or the points of a `levels.Overview`)
        and its loss-scale record (the `optimizer` columns, `format/stalled.py`), or None
        without a digest."""
        record = self._loss_scale_series(run_store)
        loss_scale_series = None
        if record is not None:
            fields, series = record
            loss_scale_series = rule_columns.LossScaleSeries(fields, series.steps, series.values)
        if view is None:
            digests = columns.read_digests(run_store)
        else:
            digests = [view.series]
            first = view.first_steps[0] if len(view.first_steps) else None
            loss_scale_series = levels.loss_scale_at(loss_scale_series, view.series.steps, first)
        found = columns.digest_columns(layers, digests, loss_scale_series)
        if not (len(found.steps) and found.layers):
            return None
        return found

    def onset_impl(self, ctx, experiment, run, ratio=health.DEFAULT_RATIO):
        """Returns the `/onset` body: where each flag was first raised in a run (`onset`).

        Raises:
          NotFoundError: no such run, or it has no logged step.
        """
        steps, columns, listed = self._judged_columns(ctx, experiment, run)
        in_step = self._in_step(self._store(ctx, experiment, run), steps)
        body = onset.onset_body(run, steps, columns, ratio, listed, in_step)
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
        in_step = self._in_step(self._store(ctx, experiment, run), steps)
        body = onset.onset_body(run, steps, columns, ratio, listed, in_step)
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
            found, listed = columns.records_columns(layers, run_store.series_by_kind(layers))
            result = (*found, listed)
        else:
            result = (*found, columns.listed_dead_channels(run_store, layers))
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
        start=None,
        end=None,
    ):
        """Returns the `/timeline` body: every layer over every logged step, from the digest.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run: a run name.
          field, role, ratio: as `timeline.timeline_source` takes them.
          width, start, end: as `timeline.timeline_body` takes them.

        Returns:
          A dict as described in docs/API.md. The same object while the run's
          digest and budget series have no new point: callers do not change it.

        Raises:
          InvalidArgumentError: `start` is after `end`.
          NotFoundError: no such run, it has no digest (written before digests), or no
            logged step from `start` to `end`.
        """
        if start is not None and end is not None and start > end:
            raise errors.InvalidArgumentError(
                f"start must be at most end; received start={start}, end={end}"
            )
        run_store = self._store(ctx, experiment, run)
        listing = run_store.digest_listing()
        found = catalog.digest_series(run, listing, self._caches.skip_warning)
        budget = run_store.budget()
        key = (experiment, run, field, role, width, ratio, start, end)
        current = (
            tuple(
                (tag, tuple(series.version(ts) for _, ts in d.parts)) for tag, d in found.items()
            ),
            levels.versions(listing),
            None if budget is None else series.version(budget.time_series),
        )
        body = self._caches.bodies.get(key, current)
        if body is not None:
            return body
        # One body of a run at a time: the tab asks for several widths at once,
        # and a body holds arrays of every layer over every step while it is built.
        with self._caches.reading([("timeline", experiment, run)]):
            body = self._caches.bodies.get(key, current)
            if body is None:
                skip_warning = self._caches.skip_warning
                view = levels.overview(run_store, found, listing, skip_warning, width, start, end)
                source_key = ("timeline_source", experiment, run, field, role, ratio)
                if view is not None:
                    source_key += view.key
                source = self._caches.bodies.get(source_key, current)
                if source is None:
                    source = self._timeline_source(run_store, field, role, ratio, view)
                    self._caches.bodies.put(source_key, current, source)
                body = self._timeline_body(run, source, field, role, width, start, end)
                if view is not None:
                    body = levels.spanned(body, view, start, end)
                body["budget"] = self.budget_impl(ctx, experiment, run)
                self._caches.bodies.put(key, current, body)
        return body

    def _timeline_source(self, run_store, field, role, ratio, view=None):
        """The run's `timeline.Source` from its digest columns, those `/onset` judges: another
        width or range (a zoom) is cut from it without reading the digest again; or from the
        points of a `levels.Overview`, judged alike."""
        if view is not None:
            found = self._digest_columns(run_store, run_store.layers(), view)
            if found is None:  # no point in the range
                return timeline.Source(view.series.steps, [])
            return timeline.timeline_source(found, field, role, ratio)
        found = self._digest_columns(run_store, run_store.layers())
        if found is None:
            raise errors.NotFoundError(
                f"run {run_store.run!r} has no digest (it was written by a tb_gradviz without one)"
            )
        return timeline.timeline_source(found, field, role, ratio)

    def _timeline_body(self, run, source, field, role, width, start, end):
        """Cuts the `/timeline` body of one width and range from the run's `timeline.Source`."""
        body = timeline.timeline_body(run, source, field, role, width, start, end)
        if body is None:
            first = "its first" if start is None else f"step {start}"
            last = "its last" if end is None else f"step {end}"
            raise errors.NotFoundError(f"run {run!r} has no logged step from {first} to {last}")
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

    def full_records_impl(self, ctx, experiment, run):
        """Returns `{"logged": [steps], "full": [steps]}`: the run's logged steps and those with
        full records (`kept.full_record_steps`); the others have the digest only.

        Raises:
          NotFoundError: no such run, or it holds no tb_gradviz data.
        """
        run_store = self._store(ctx, experiment, run)
        return kept.full_record_steps(run_store, run_store.layers())

    def loss_scale_impl(self, ctx, experiment, run):
        """Returns the steps the run's `LossScaleOptimizer` skipped (`loss_scale.skipped_steps`),
        or None without a loss-scale record.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run: a run name.
        """
        record = self._loss_scale_series(self._store(ctx, experiment, run))
        if record is None:
            return None
        fields, series = record
        return loss_scale.skipped_steps(fields, series.steps, series.values)

    def _in_step(self, run_store, steps):
        """`[steps]` bool: where the run's digest-source record says the train step computed
        the digest (`digest="step"`), or None without such a record."""
        record = self._fields_record(run_store, metadata.KIND_DIGEST_SOURCE)
        if record is None:
            return None
        fields, series = record
        return np.isin(steps, series.steps[digest.marked_in_step(fields, series.values)])

    def _loss_scale_series(self, run_store):
        """`(fields, series)` of the run's loss-scale record, or None without one."""
        return self._fields_record(run_store, metadata.KIND_LOSS_SCALE)

    def _fields_record(self, run_store, kind):
        """`(fields, series)` of the run's digest-plugin record of `kind`, a vector of the fields
        its metadata lists that counts no elements (the loss scale's, the digest source's), or
        None without one."""
        found = run_store.fields_series(kind)
        if found is None:
            return None
        layout = records.Layout(kind, (len(found.fields),), lambda values: values[:, :0])
        series = run_store.read({found.tag: found.time_series}, layout, digest.PLUGIN_NAME)
        series = series[found.tag]
        return None if series is None else (found.fields, series)
