"""Reading tb_gradviz series through TensorBoard's data provider.

`RunStore` is bound to one request's provider, context, experiment and run:
it lists the run's layers, reads whole series and reads last points. What
it returns is decoded into today's record layouts (`series.decode_series`),
so the response bodies never see an older layout or a malformed row (each
row left out is logged, with its run, tag and step); the caches it reads
through (`series.Caches`) outlive the request. Imports neither TensorFlow
nor Keras.
"""

import functools

from tensorboard import errors
from tensorboard.data import provider
from tensorboard.plugins.histogram import metadata as histogram_metadata

from tb_gradviz.board import catalog, parts
from tb_gradviz.board.series import decode_series, version
from tb_gradviz.format import digest, metadata, records

# Ask the provider for every point it holds: it has already downsampled to
# `--samples_per_plugin` at load time, and a second, random downsampling here
# would drop steps the user asked TensorBoard to keep.
ALL_SAMPLES = 10**8

# Tags per `read_tensors` request: 16 stats series of 1000 steps are ~11 MB, far below
# the data server's 256 MB message limit (that allows ~20 000 steps per series).
_READ_BATCH_TAGS = 16


class RunStore:
    """The tb_gradviz series of one run, for one request.

    Args:
      data_provider: TensorBoard's `context.data_provider`.
      caches: the plugin's `Caches`.
      ctx: the request's `tensorboard.context.RequestContext`.
      experiment: the experiment id.
      run: the run name, or None for `list_runs` only.
    """

    def __init__(self, data_provider, caches, ctx, experiment, run=None):
        self._provider = data_provider
        self._caches = caches
        self._ctx = ctx
        self._experiment = experiment
        self.run = run

    # Listing.

    def _list(self, plugin_name, run=None, tag=None):
        run_tag_filter = provider.RunTagFilter(
            runs=None if run is None else [run], tags=None if tag is None else [tag]
        )
        listing = self._provider.list_tensors(
            self._ctx,
            experiment_id=self._experiment,
            plugin_name=plugin_name,
            run_tag_filter=run_tag_filter,
        )
        if plugin_name == metadata.PLUGIN_NAME:
            # Each series under its own version: see `_listed`.
            for listed_run, time_series_by_tag in listing.items():
                for listed_tag, time_series in time_series_by_tag.items():
                    self._caches.listings.put(
                        (self._experiment, listed_run, listed_tag),
                        version(time_series),
                        time_series,
                    )
        return listing

    def list_runs(self):
        """Returns `{run: layer index}` of every run with tb_gradviz data (see `layers`)."""
        result = {}
        for run, time_series_by_tag in self._list(metadata.PLUGIN_NAME).items():
            layers = catalog.layer_index(run, time_series_by_tag, self._caches.skip_warning)
            if layers:
                result[run] = layers
        return result

    def layers(self):
        """Returns the run's layer index, `{layer: {"info", "tensors", ...}}` (`catalog`).

        `tensors` maps a tensor name to a `catalog.Listed`; `routing`, `units`
        and `routing_map` are each one or None.

        Raises:
          NotFoundError: the run holds no tb_gradviz data.
        """
        listing = self._list(metadata.PLUGIN_NAME, run=self.run).get(self.run) or {}
        layers = catalog.layer_index(self.run, listing, self._caches.skip_warning)
        if not layers:
            raise errors.NotFoundError(f"no tb_gradviz data in run {self.run!r}")
        return layers

    def _list_one(self, plugin_name, tag):
        return self._list(plugin_name, run=self.run, tag=tag).get(self.run, {}).get(tag)

    def _listed(self, tag, histogram_series):
        """Lists a stats or routing series, reused while a sibling histogram is unchanged.

        With the Rust data server, listing a `gradviz` series (its metadata
        is a JSON object) is far slower than listing its `histograms`
        sibling (bench/RESULTS.md, section 4). Both are written
        in the same events (docs/FORMAT.md), so new points change the
        histogram's `(max_step, max_wall_time)` too, and an unchanged
        histogram listing means an unchanged stats one.
        """
        if histogram_series is None:
            return self._list_one(metadata.PLUGIN_NAME, tag)
        time_series = self._caches.listings.get(
            (self._experiment, self.run, tag), version(histogram_series)
        )
        if time_series is None:
            # One call lists the whole run for about what one tag costs.
            time_series = self._list(metadata.PLUGIN_NAME, run=self.run).get(self.run, {}).get(tag)
        return time_series

    def _content(self, tag, time_series):
        if time_series is None:
            return None
        return catalog.parse_content(time_series, self.run, tag, self._caches.skip_warning)

    def tensor(self, layer, tensor):
        """Returns the `catalog.TensorSeries` of one tensor.

        Raises:
          NotFoundError: no such layer or tensor in the run.
        """
        histogram_tag = records.histogram_tag(layer, tensor)
        histogram_series = self._list_one(histogram_metadata.PLUGIN_NAME, histogram_tag)
        tag = records.stats_tag(layer, tensor)
        time_series = self._listed(tag, histogram_series)
        content = self._content(tag, time_series)
        if (
            content is None
            or content["kind"] != metadata.KIND_TENSOR
            or content["layer"] != layer
            or content["tensor"] != tensor
        ):
            raise errors.NotFoundError(
                f"no tensor {tensor!r} of layer {layer!r} in run {self.run!r}"
            )
        if content["histogram_tag"] != histogram_tag:
            histogram_series = self._list_one(
                histogram_metadata.PLUGIN_NAME, content["histogram_tag"]
            )
        return catalog.TensorSeries(content, time_series, histogram_series)

    def routing(self, layer):
        """Returns the `catalog.Listed` of a pooling layer's routing record.

        Raises:
          NotFoundError: no such layer, or it is not a pooling layer.
        """
        tag = records.routing_tag(layer)
        # Routing is recorded only for one-input pooling layers, in the same
        # events as their `input_gradient` histogram: its (cheap) listing
        # validates the last listing of the routing series.
        histogram_series = self._list_one(
            histogram_metadata.PLUGIN_NAME, records.histogram_tag(layer, records.INPUT_GRADIENT)
        )
        time_series = self._listed(tag, histogram_series)
        content = self._content(tag, time_series)
        if content is None or content["kind"] != metadata.KIND_ROUTING or content["layer"] != layer:
            raise errors.NotFoundError(
                f"no routing record of layer {layer!r} in run {self.run!r} (not a pooling layer?)"
            )
        return catalog.Listed(tag, content, time_series)

    def routing_map(self, layer):
        """Returns the `catalog.Listed` of a pooling layer's routing map.

        Raises:
          NotFoundError: no such layer, or it has no routing map.
        """
        layers = self.layers()
        found = layers.get(layer, {}).get("routing_map")
        if found is None:
            raise errors.NotFoundError(
                f"no routing map of layer {layer!r} in run {self.run!r} (not a pooling layer, "
                "or logged with routing_map=False)"
            )
        return found

    def updates(self, layer):
        """Returns `{weight: catalog.Listed}` of a layer's update records.

        The weights are in the layer's weight order.

        Raises:
          NotFoundError: no such layer, or it has no update records.
        """
        found = self.layers().get(layer)
        if not found or not found["updates"]:
            raise errors.NotFoundError(
                f"no update records of layer {layer!r} in run {self.run!r} (logged without "
                "weights=True, a layer without trainable weights, or a single log event)"
            )
        return catalog.weight_updates(found)

    def digest_listing(self):
        """`{tag: provider.TensorTimeSeries}` of the run's series under the digest's plugin."""
        return self._list(digest.PLUGIN_NAME, run=self.run).get(self.run) or {}

    def digests(self):
        """`{series tag: catalog.Digest}` of the run's digest series (`catalog.digest_series`)."""
        return catalog.digest_series(self.run, self.digest_listing(), self._caches.skip_warning)

    def read_digest(self, series_tag, found, layout):
        """Returns the `Series` of a digest series, its parts joined in step order.

        Each part is asked for in a request of its own (`digest_parts.PART_BYTES`
        each, far below the data server's message limit) when the one before is
        decoded (`parts.joined`); the series is cached under the versions of
        every part.

        Args:
          series_tag: its key in `digests()`.
          found: its `catalog.Digest`.
          layout: its `records.Layout` (`columns.digest_layout`).
        """
        key = self._key(digest.PLUGIN_NAME, series_tag, ALL_SAMPLES)
        versions = tuple(version(time_series) for _, time_series in found.parts)
        series = self._caches.series.get(key, versions)
        if series is not None:
            return series
        with self._caches.reading([key]):
            series = self._caches.series.get(key, versions)
            if series is not None:
                return series
            # Each part read when the previous one is decoded into the joined series.
            points = (
                self._read_points(digest.PLUGIN_NAME, [tag], ALL_SAMPLES).get(tag, [])
                for tag, _ in found.parts
            )
            left_out = functools.partial(self._caches.left_out, self.run, series_tag)
            series = parts.joined(points, layout, found.capacity, left_out)
            self._caches.series.put(key, versions, series)
        return series

    def budget(self):
        """The run's cost-budget series (a `catalog.Budget`), or None."""
        return self.fields_series(metadata.KIND_BUDGET)

    def fields_series(self, kind):
        """The run's first digest-plugin series of `kind` listing its `fields`, or None."""
        for tag, time_series in sorted(self.digest_listing().items()):
            content = self._content(tag, time_series)
            if content is not None and content["kind"] == kind:
                return catalog.Budget(tag, content["fields"], time_series)
        return None

    # Reading.

    def series_by_kind(self, layers, limit=None):
        """`{kind: {tag: Series}}` of every record of `layers`, by kind (`catalog.KINDS`).

        Args:
          layers: the run's layer index (`layers`), or a part of it.
          limit: None to read every series whole; a step to read only what
            each series' rows up to it need (`read_at`).
        """
        result = {}
        for kind, found in catalog.listed_by_kind(layers).items():
            layout = catalog.KINDS[kind][1]
            read = self.read(found, layout) if limit is None else self.read_at(found, layout, limit)
            result[kind] = read
        return result

    def read(self, time_series_by_tag, layout, plugin_name=metadata.PLUGIN_NAME):
        """Returns `{tag: Series}` of every point of the given series, from cache when current.

        Args:
          time_series_by_tag: `{tag: provider.TensorTimeSeries}` as listed
            just before; their `(max_step, max_wall_time)` validate the cache.
          layout: the `records.Layout` of the series.
          plugin_name: whose series they are (`gradviz` or `histograms`).
        """
        return self._read_cached(time_series_by_tag, layout, plugin_name, ALL_SAMPLES)[0]

    def read_later(self, time_series_by_tag, layout, plugin_name=metadata.PLUGIN_NAME, limit=None):
        """Like `read` (`read_at` with a `limit`), on a reader thread: returns a future of its
        result."""
        if limit is None:
            return self._caches.readers.submit(self.read, time_series_by_tag, layout, plugin_name)
        read = self.read_at
        return self._caches.readers.submit(read, time_series_by_tag, layout, limit, plugin_name)

    def read_at(self, time_series_by_tag, layout, limit, plugin_name=metadata.PLUGIN_NAME):
        """Like `read`, for series whose rows up to step `limit` are all that is needed.

        A series whose last step is `<= limit`, and whose full decoding is not
        cached, is read as its last point alone (the provider always keeps
        it): the grid at the latest step of 200 layers x 1000 steps reads 800
        points, not 800 000. Any other series is read whole.
        """
        result, full, last_only = {}, {}, {}
        for tag, time_series in time_series_by_tag.items():
            cached = self._caches.series.get(
                self._key(plugin_name, tag, ALL_SAMPLES), version(time_series)
            )
            if cached is not None:
                result[tag] = cached
            elif time_series.max_step is not None and time_series.max_step <= limit:
                last_only[tag] = time_series
            else:
                full[tag] = time_series

        def is_listed_last_point(series, time_series):
            # A last point with a bad layout, or not at the listed last step:
            # the row wanted is further back.
            return len(series.steps) == 1 and int(series.steps[0]) == time_series.max_step

        last, refused = self._read_cached(
            last_only, layout, plugin_name, 1, accept=is_listed_last_point
        )
        result.update(last)
        full.update(refused)
        result.update(self.read(full, layout, plugin_name))
        return result

    def _key(self, plugin_name, tag, downsample):
        return (self._experiment, plugin_name, self.run, tag, downsample)

    def _read_cached(self, time_series_by_tag, layout, plugin_name, downsample, accept=None):
        """Reads and decodes the series not cached for this listing; caches what `accept`s.

        Args:
          downsample: what to ask the provider for; series read with
            different `downsample` are cached apart.
          accept: None, or `(series, time_series) -> bool`; a decoded series
            it refuses is neither cached nor returned.

        Returns:
          `({tag: Series}, {tag: time_series refused by accept})`.
        """
        result, stale, refused = {}, {}, {}

        def from_cache(time_series_by_tag):
            for tag, time_series in time_series_by_tag.items():
                series = self._caches.series.get(
                    self._key(plugin_name, tag, downsample), version(time_series)
                )
                if series is None:
                    stale[tag] = time_series
                else:
                    result[tag] = series

        from_cache(time_series_by_tag)
        if not stale:
            return result, refused
        # One request at a time reads a series: the others wait for it and take
        # it from the cache (a tab asks for a long run's /timeline at several
        # widths at once, and each read of its digest is hundreds of MB).
        with self._caches.reading([self._key(plugin_name, tag, downsample) for tag in stale]):
            waited, stale = stale, {}
            from_cache(waited)
            data = self._read_points(plugin_name, sorted(stale), downsample)
            for tag, time_series in stale.items():
                left_out = functools.partial(self._caches.left_out, self.run, tag)
                series = decode_series(data.get(tag, []), layout, left_out)
                if accept is not None and not accept(series, time_series):
                    refused[tag] = time_series
                    continue
                self._caches.series.put(
                    self._key(plugin_name, tag, downsample), version(time_series), series
                )
                result[tag] = series
        return result, refused

    def _read_points(self, plugin_name, tags, downsample):
        """Returns `{tag: [provider.TensorDatum]}`, asking for `_READ_BATCH_TAGS` tags at a time.

        The Rust data server answers in one gRPC message, which TensorBoard
        caps at 256 MB, and answers a larger one with a 500. Last points
        alone (`downsample=1`) are asked for at once: each request has a
        fixed cost.
        """
        data = {}
        batch = len(tags) if downsample == 1 else _READ_BATCH_TAGS
        for start in range(0, len(tags), max(batch, 1)):
            data.update(
                self._provider.read_tensors(
                    self._ctx,
                    experiment_id=self._experiment,
                    plugin_name=plugin_name,
                    downsample=downsample,
                    run_tag_filter=provider.RunTagFilter(
                        runs=[self.run], tags=tags[start : start + batch]
                    ),
                ).get(self.run, {})
            )
        return data
