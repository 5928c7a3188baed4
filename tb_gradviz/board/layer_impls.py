"""The plugin's `*_impl` methods that read one layer's records, or a run's list of layers.

Plain data in, plain data out: the routes (`plugin`) answer what they
return as JSON, and the CLI calls them too. Each reads through a
`store.RunStore` and builds its body with `responses`. Imports neither
TensorFlow nor Keras.
"""

import bisect

from tensorboard import errors
from tensorboard.plugins.histogram import metadata as histogram_metadata

from tb_gradviz.board import query, responses, series, store, timeline
from tb_gradviz.format import records


def _at_or_before(found, step, missing):
    """`found` (a `series.Series`) whole when `step` is None, else its latest row at `<= step`.

    The routes that take a `step` serve what the layer view shows at that
    step: the record written last at or before it, as `/step` takes each
    layer's latest step `<= step`.

    Raises:
      NotFoundError: `f"{missing} <= {step}"`, when it has no such row.
    """
    if step is None:
        return found
    row = found.index_at_or_before(step)
    if row is None:
        raise errors.NotFoundError(f"{missing} <= {step}")
    return found.row(row)


class LayerImpls:
    """Reads of one layer's records (and `/runs`), over a data provider.

    Args:
      data_provider: TensorBoard's `context.data_provider`.
    """

    def __init__(self, data_provider):
        self._data_provider = data_provider
        self._caches = series.Caches()

    def _store(self, ctx, experiment, run=None):
        return store.RunStore(self._data_provider, self._caches, ctx, experiment, run)

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

        The histograms are read only when the body sends them: a series of
        more steps than `width` is sent downsampled, without them. When every
        row sent has its histogram (`width` None, or one `step`), both series
        are read at once; otherwise the stats first (usually cached), and
        the histograms after, only if the series is not downsampled. With a
        `step`, both are read only as far as its row needs (`RunStore.read_at`:
        at or after a series' last step, its last point alone).

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
        found = run_store.tensor(layer, tensor)
        tag, histogram_tag = records.stats_tag(layer, tensor), found.content["histogram_tag"]
        listed = {histogram_tag: found.histograms} if found.histograms is not None else {}
        histogram_args = (listed, records.HISTOGRAM, histogram_metadata.PLUGIN_NAME)
        later = None
        if listed and (width is None or step is not None):
            later = run_store.read_later(*histogram_args, limit=step)
        if step is None:
            stats = run_store.read({tag: found.stats}, records.STATS)[tag]
        else:
            stats = run_store.read_at({tag: found.stats}, records.STATS, step)[tag]
        stats = _at_or_before(stats, step, f"{layer!r} {tensor!r} has no step")
        histograms = None
        if later is not None:
            histograms = later.result()[histogram_tag]
        elif listed and not responses.downsampled(stats, width):
            histograms = run_store.read(*histogram_args)[histogram_tag]
        return responses.series_body(run, found.content, stats, histograms, width)

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
        found = run_store.routing(layer)
        routing = run_store.read({found.tag: found.time_series}, records.ROUTING)[found.tag]
        routing = _at_or_before(routing, step, f"{layer!r} has no routing record at a step")
        return responses.routing_body(run, found.content, routing)

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
            {listed.tag: listed.time_series for listed in found.values()}, records.UPDATE
        )
        return responses.updates_body(
            run, layer, {weight: by_tag[listed.tag] for weight, listed in found.items()}
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
                listed.tag: listed.time_series
                for layer in layers.values()
                for listed in layer["precision"].values()
            },
            records.PRECISION,
        )
        return responses.precision_body(
            run,
            {
                name: {tensor: by_tag[listed.tag] for tensor, listed in layer["precision"].items()}
                for name, layer in layers.items()
                if layer["precision"]
            },
        )

    def _routing_maps(self, ctx, experiment, run, layer):
        """`(content, responses.RoutingMaps)`: a layer's well-formed routing map records."""
        run_store = self._store(ctx, experiment, run)
        found = run_store.routing_map(layer)
        maps = run_store.read({found.tag: found.time_series}, records.ROUTING_MAP)[found.tag]
        return found.content, responses.valid_routing_maps(found.content, maps)

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
        content, maps = self._routing_maps(ctx, experiment, run, layer)
        limit = query.INT64_MAX if step is None else step
        index = bisect.bisect_right(maps.steps, limit) - 1
        if index < 0:
            raise errors.NotFoundError(
                f"layer {layer!r} of run {run!r} has no routing map at a step <= {limit}"
            )
        return responses.routing_map_body(run, content, maps, index)

    def routing_maps_impl(self, ctx, experiment, run, layer):
        """Returns the `/routing_map` body at each step the layer has a map (`export` reads it).

        The series is read and its records checked once, whatever the number
        of steps.

        Raises:
          NotFoundError: no such run or layer, or no routing map.
        """
        content, maps = self._routing_maps(ctx, experiment, run, layer)
        return [
            responses.routing_map_body(run, content, maps, index)
            for index in range(len(maps.steps))
        ]
