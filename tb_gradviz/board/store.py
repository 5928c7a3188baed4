"""Reading tb_gradviz series through TensorBoard's data provider, with caches.

`RunStore` is bound to one request's provider, context, experiment and run:
it lists the run's layers, reads whole series and reads last points. What
it returns is decoded into today's record layouts (`records.Layout`), so the
response bodies never see an older layout or a malformed row. Imports
neither TensorFlow nor Keras.
"""

import collections
import concurrent.futures
import threading

import numpy as np
from tensorboard import errors
from tensorboard.data import provider
from tensorboard.plugins.histogram import metadata as histogram_metadata

from tb_gradviz.board import catalog
from tb_gradviz.format import metadata, records

# Ask the provider for every point it holds: it has already downsampled to
# `--samples_per_plugin` at load time, and a second, random downsampling here
# would drop steps the user asked TensorBoard to keep.
ALL_SAMPLES = 10**8

# Upper bound of the decoded-series cache, in time series (a 500-step stats
# series is ~350 kB): enough for a few runs of 50 layers.
_CACHE_MAX_SERIES = 2048
_CACHE_MAX_LISTINGS = 16384
# Tags per `read_tensors` request: 16 stats series of 1000 steps are ~11 MB,
# far below the data server's 256 MB message limit (that allows ~20 000
# steps per series).
_READ_BATCH_TAGS = 16


class Series:
    """One decoded time series: steps, wall times and one record per row.

    Rows are sorted by step (stable, so the provider's order breaks ties);
    rows whose record has no known layout or malformed counts are left out.
    `values` is an array of the rows, or a list for records whose size the
    metadata fixes (routing maps).
    """

    __slots__ = ("steps", "wall_times", "values")

    def __init__(self, steps, wall_times, values):
        self.steps = steps
        self.wall_times = wall_times
        self.values = values

    def index_at_or_before(self, step):
        """Returns the row of the latest step `<= step`, or None if there is none."""
        position = int(np.searchsorted(self.steps, step, side="right"))
        return position - 1 if position else None

    def rows_at(self, steps):
        """Returns the row of each of `steps` (the last row of a repeated step), None where absent."""
        row_of_step = {step: row for row, step in enumerate(self.steps.tolist())}
        return [row_of_step.get(step) for step in steps]


def decode_series(data, layout):
    """Returns the `Series` of a list of `provider.TensorDatum` in `layout` (a `records.Layout`)."""
    kept = []
    for datum in data:
        array = layout.upgrade(datum.numpy)
        if array is not None:
            kept.append((datum.step, datum.wall_time, array))
    if None in layout.shape:
        # A record whose size its metadata fixes (routing maps): rows stay a
        # list, for the reader to match against that metadata.
        kept.sort(key=lambda entry: entry[0])
        steps = np.array([step for step, _, _ in kept], dtype=np.int64)
        return Series(
            steps, np.array([w for _, w, _ in kept], dtype=np.float64), [a for _, _, a in kept]
        )
    if not kept:
        return Series(
            np.zeros(0, np.int64), np.zeros(0), np.zeros((0,) + tuple(n or 0 for n in layout.shape))
        )
    steps = np.array([step for step, _, _ in kept], dtype=np.int64)
    wall_times = np.array([wall_time for _, wall_time, _ in kept], dtype=np.float64)
    values = np.stack([array for _, _, array in kept])
    valid = layout.valid_rows(values)
    order = np.argsort(steps[valid], kind="stable")
    return Series(steps[valid][order], wall_times[valid][order], values[valid][order])


class _VersionedCache:
    """Values under a key, each valid for one version, least recently used dropped first.

    Series are cached under their `(max_step, max_wall_time)` from
    `list_tensors`: a reload that adds points changes both, so a stale entry
    is never served.
    """

    def __init__(self, max_entries):
        self._max_entries = max_entries
        self._entries = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, version):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != version:
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key, version, value):
        with self._lock:
            self._entries[key] = (version, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)


def _version(time_series):
    return (time_series.max_step, time_series.max_wall_time)


class Caches:
    """What outlives a request: decoded series, listings, reader threads, warnings given."""

    def __init__(self, max_series=_CACHE_MAX_SERIES):
        self.series = _VersionedCache(max_series)
        self.listings = _VersionedCache(_CACHE_MAX_LISTINGS)
        # /series reads a tensor's stats and its histograms at once: each read
        # of the Rust data server has a fixed wait however small the answer
        # (bench/RESULTS.md, section 4).
        self.readers = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="gradviz-read")
        self.skip_warning = catalog.SkipWarning()


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
                        _version(time_series),
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
        """Returns the run's layer index: `{layer: {"info", "tensors", "routing"}}`.

        `tensors` maps a tensor name to `(tag, content, time_series)`,
        `routing`, `units` and `routing_map` are such triples or None.

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
        """Lists a stats or routing series, reusing its last listing while a sibling histogram is unchanged.

        With the Rust data server, listing a `gradviz` series (its metadata
        is a JSON object) is two orders of magnitude slower than listing its
        `histograms` sibling (bench/RESULTS.md, section 4). Both are written
        in the same events (docs/FORMAT.md), so new points change the
        histogram's `(max_step, max_wall_time)` too, and an unchanged
        histogram listing means an unchanged stats one.
        """
        if histogram_series is None:
            return self._list_one(metadata.PLUGIN_NAME, tag)
        time_series = self._caches.listings.get(
            (self._experiment, self.run, tag), _version(histogram_series)
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
        """Returns `(content, stats time series, histogram time series or None)` of one tensor.

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
        return content, time_series, histogram_series

    def routing(self, layer):
        """Returns `(content, time series)` of a pooling layer's routing record.

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
        return content, time_series

    def routing_map(self, layer):
        """Returns `(content, time series)` of a pooling layer's routing map.

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
        return found[1], found[2]

    def updates(self, layer):
        """Returns `{weight: (tag, content, time series)}` of a layer's update records, in weight order.

        Raises:
          NotFoundError: no such layer, or it has no update records.
        """
        found = self.layers().get(layer)
        if not found or not found["updates"]:
            raise errors.NotFoundError(
                f"no update records of layer {layer!r} in run {self.run!r} (logged without weights=True, "
                "a layer without trainable weights, or a single log event)"
            )
        return catalog.weight_updates(found)

    # Reading.

    def read(self, time_series_by_tag, layout, plugin_name=metadata.PLUGIN_NAME):
        """Returns `{tag: Series}` of every point of the given series, from cache when current.

        Args:
          time_series_by_tag: `{tag: provider.TensorTimeSeries}` as listed
            just before; their `(max_step, max_wall_time)` validate the cache.
          layout: the `records.Layout` of the series.
          plugin_name: whose series they are (`gradviz` or `histograms`).
        """
        return self._read_cached(time_series_by_tag, layout, plugin_name, ALL_SAMPLES)[0]

    def read_later(self, time_series_by_tag, layout, plugin_name=metadata.PLUGIN_NAME):
        """Like `read`, on a reader thread: returns a future of its result."""
        return self._caches.readers.submit(self.read, time_series_by_tag, layout, plugin_name)

    def read_at(self, time_series_by_tag, layout, limit):
        """Like `read`, for series whose rows up to step `limit` are all that is needed.

        A series whose last step is `<= limit`, and whose full decoding is not
        cached, is read as its last point alone (the provider always keeps
        it): the grid at the latest step of 200 layers x 1000 steps reads 800
        points, not 800 000. Any other series is read whole.
        """
        result, full, last_only = {}, {}, {}
        for tag, time_series in time_series_by_tag.items():
            cached = self._caches.series.get(
                self._key(metadata.PLUGIN_NAME, tag, ALL_SAMPLES), _version(time_series)
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
            last_only, layout, metadata.PLUGIN_NAME, 1, accept=is_listed_last_point
        )
        result.update(last)
        full.update(refused)
        result.update(self.read(full, layout))
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
        for tag, time_series in time_series_by_tag.items():
            series = self._caches.series.get(
                self._key(plugin_name, tag, downsample), _version(time_series)
            )
            if series is None:
                stale[tag] = time_series
            else:
                result[tag] = series
        data = self._read_points(plugin_name, sorted(stale), downsample)
        for tag, time_series in stale.items():
            series = decode_series(data.get(tag, []), layout)
            if accept is not None and not accept(series, time_series):
                refused[tag] = time_series
                continue
            self._caches.series.put(
                self._key(plugin_name, tag, downsample), _version(time_series), series
            )
            result[tag] = series
        return result, refused

    def _read_points(self, plugin_name, tags, downsample):
        """Returns `{tag: [provider.TensorDatum]}`, asking for `_READ_BATCH_TAGS` tags at a time.

        The Rust data server answers in one gRPC message, which TensorBoard
        caps at 256 MB: all 800 stats series of 200 layers x 1000 steps
        (~560 MB) in one request failed with a 500. Last points alone
        (`downsample=1`) are asked for at once: each request has a fixed cost.
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
