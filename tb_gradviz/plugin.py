"""The tb_gradviz TensorBoard plugin: serves the "GradViz" tab and its data.

Imports neither TensorFlow nor Keras: TensorBoard imports every installed
plugin at start, and one failing import stops TensorBoard. Data is read only
through `context.data_provider`, so both loaders work (the Python multiplexer
with `--load_fast=false` and the Rust data server). The HTTP API is described
in docs/API.md, the records it reads in docs/FORMAT.md.
"""

import collections
import concurrent.futures
import importlib.util
import os
import re
import threading

import numpy as np
from werkzeug import wrappers

from tensorboard import errors
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from tensorboard.plugins.histogram import metadata as histogram_metadata

from tb_gradviz import format as fmt
from tb_gradviz import metadata

# Ask the provider for every point it holds: it has already downsampled to
# `--samples_per_plugin` at load time, and a second, random downsampling here
# would drop steps the user asked TensorBoard to keep.
_ALL_SAMPLES = 10**8

_JSON = "application/json"
_ALLOWED_METHODS = ("GET", "HEAD")

# Only these files are served from the frontend folder, with these types. The
# module must be `text/javascript`: with any other type the iframe stays blank.
_STATIC_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
}
_STATIC_ROUTE = "/static"
_STATIC_URL_PREFIX = "/data/plugin/%s%s/" % (metadata.PLUGIN_NAME, _STATIC_ROUTE)

# A step in a query: ASCII digits only (int() also takes "1_0", " 1" and
# other scripts' digits), and short enough that parsing it is cheap.
_STEP_PATTERN = re.compile(r"-?[0-9]{1,30}")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# Stats fields that count elements, served as integers.
_COUNT_FIELDS = ("count", "zeros", "nan", "pos_inf", "neg_inf")
_COUNT_COLUMNS = [fmt.STATS_FIELDS.index(name) for name in _COUNT_FIELDS]
_HEAD = len(fmt.STATS_FIELDS)
_NEGATIVE_BINS = slice(_HEAD, _HEAD + fmt.MAGNITUDE_BINS)
_POSITIVE_BINS = slice(_HEAD + fmt.MAGNITUDE_BINS, fmt.STATS_LENGTH)
# Routing fields that count elements; `tied_windows` is NaN for average pools.
_ROUTING_COUNT_FIELDS = ("input_positions", "routed_positions", "windows", "tied_windows")
_ROUTING_SHAPE = (len(fmt.ROUTING_FIELDS),)
# Version-1 routing records written before `output_gradient_abs_sum` was
# added hold the first six fields; they are served with NaN for it.
_ROUTING_MIN_LENGTH = 6

_LOG_EDGES = fmt.LOG_EDGES.tolist()

# Upper bound of the decoded-series cache, in time series (a 500-step stats
# series is ~350 kB): enough for a few runs of 50 layers.
_CACHE_MAX_SERIES = 2048
_CACHE_MAX_LISTINGS = 16384
# Tags per `read_tensors` request: 16 stats series of 1000 steps are ~11 MB,
# far below the data server's 256 MB message limit (that allows ~20 000
# steps per series).
_READ_BATCH_TAGS = 16


class _MethodNotAllowedError(errors.PublicError):
    """A request with a method other than GET or HEAD (HTTP 405).

    TensorBoard routes every method to a plugin's handlers, so the plugin
    checks it itself.
    """

    http_code = 405

    def __init__(self, method):
        super().__init__(f"Method not allowed: {method}; this route answers {', '.join(_ALLOWED_METHODS)}")
        self.headers = [("Allow", ", ".join(_ALLOWED_METHODS))]


class _Series:
    """One decoded time series: steps, wall times and one record per row.

    Rows are sorted by step (stable, so the provider's order breaks ties) and
    rows whose record does not have the expected layout are left out.
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


def _decode_series(data, row_shape, count_columns, min_length=None):
    """Returns the `_Series` of a list of `provider.TensorDatum`.

    Args:
      data: the provider's points of one time series.
      row_shape: the shape every record must have; others are left out.
      count_columns: a function of the `[n, ...]` value array returning the
        part that counts elements, which must be finite and non-negative
        (a row failing that is left out rather than served as a bogus int).
      min_length: for vector records, the shortest length accepted; shorter
        records than `row_shape` are padded with NaN (fields added later).
    """
    (full_length,) = row_shape if min_length is not None else (None,)
    kept = []
    for datum in data:
        array = np.asarray(datum.numpy, dtype=np.float64)
        if array.shape != row_shape:
            if min_length is None or array.ndim != 1 or not min_length <= array.size < full_length:
                continue
            array = np.concatenate([array, np.full(full_length - array.size, np.nan)])
        kept.append((datum.step, datum.wall_time, array))
    if not kept:
        return _Series(np.zeros(0, np.int64), np.zeros(0), np.zeros((0,) + row_shape))
    steps = np.array([step for step, _, _ in kept], dtype=np.int64)
    wall_times = np.array([wall_time for _, wall_time, _ in kept], dtype=np.float64)
    values = np.stack([array for _, _, array in kept])
    counts = count_columns(values).reshape(len(kept), -1)
    valid = np.all(np.isfinite(counts) & (counts >= 0), axis=1)
    order = np.argsort(steps[valid], kind="stable")
    return _Series(steps[valid][order], wall_times[valid][order], values[valid][order])


def _stats_counts(values):
    return np.concatenate([values[:, _COUNT_COLUMNS], values[:, _HEAD:]], axis=1)


def _histogram_counts(values):
    return values[:, :, 2]


def _routing_counts(values):
    # `tied_windows` may be NaN (average pooling); the three others must count.
    return values[:, :3]


class _SeriesCache:
    """Decoded time series, reused while the provider's data is unchanged.

    An entry is keyed on (experiment, plugin, run, tag) and tagged with the
    series' `(max_step, max_wall_time)` from `list_tensors`: a reload that
    adds points changes both, so a stale entry is never served. Least recently
    used entries are dropped beyond `max_series`.
    """

    def __init__(self, max_series=_CACHE_MAX_SERIES):
        self._max_series = max_series
        self._entries = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, version):
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != version:
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key, version, series):
        with self._lock:
            self._entries[key] = (version, series)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_series:
                self._entries.popitem(last=False)


def _version(time_series):
    return (time_series.max_step, time_series.max_wall_time)


def _is_str(value):
    return isinstance(value, str)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_shape(value):
    return isinstance(value, list) and all(_is_int(n) or n is None for n in value)


def _valid_content(content):
    """Whether parsed metadata has the fields, of the types, the routes rely on."""
    common = (
        _is_str(content.get("layer"))
        and _is_int(content.get("layer_index"))
        and _is_str(content.get("layer_class", ""))
        and _is_str(content.get("layer_dtype", ""))
        and _is_str(content.get("backend", ""))
        and _is_str(content.get("device", ""))
        and isinstance(content.get("pooling"), (dict, type(None)))
    )
    if not common or content["kind"] == metadata.KIND_ROUTING:
        return common
    return (
        _is_str(content.get("tensor"))
        and _is_str(content.get("role"))
        and _is_int(content.get("index"))
        and _is_str(content.get("histogram_tag"))
        and _is_shape(content.get("shape"))
        and _is_str(content.get("dtype", ""))
    )


def _parse_content(time_series):
    """Returns a series' tb_gradviz metadata as a dict, or None if it is not ours or malformed."""
    try:
        content = metadata.parse_plugin_metadata(time_series.plugin_content)
    except (ValueError, TypeError):
        # Foreign, newer or corrupt metadata under our plugin name: skip the
        # series, serve the rest.
        return None
    return content if _valid_content(content) else None


def _tensor_order(tensor):
    role = tensor["role"]
    role_rank = fmt.ROLES.index(role) if role in fmt.ROLES else len(fmt.ROLES)
    return (role_rank, tensor["index"], tensor["tensor"])


def _layer_index(time_series_by_tag):
    """Groups one run's tb_gradviz series by layer.

    Args:
      time_series_by_tag: `{tag: provider.TensorTimeSeries}` of plugin `gradviz`.

    Returns:
      `{layer: {"info": content, "tensors": {tensor: (tag, content, series)},
      "routing": (tag, content, series) or None}}`.
    """
    layers = {}
    # Sorted tags: loaders list them in different orders, and the first
    # metadata seen for a layer must not depend on that.
    for tag in sorted(time_series_by_tag):
        time_series = time_series_by_tag[tag]
        content = _parse_content(time_series)
        if content is None:
            continue
        layer = layers.setdefault(content["layer"], {"info": content, "tensors": {}, "routing": None})
        if content["kind"] == metadata.KIND_ROUTING:
            layer["routing"] = (tag, content, time_series)
        else:
            layer["tensors"][content["tensor"]] = (tag, content, time_series)
    # A layer seen only through a routing record has no tensors to show.
    return {name: layer for name, layer in layers.items() if layer["tensors"]}


def _layer_summary(name, layer):
    """The `/runs` description of one layer."""
    info = layer["info"]
    pooling = layer["routing"][1].get("pooling") if layer["routing"] else None
    if pooling is None:
        pooling = next((t[1]["pooling"] for t in layer["tensors"].values() if t[1].get("pooling")), None)
    tensors = sorted(
        (
            {
                "tensor": content["tensor"],
                "role": content["role"],
                "index": content["index"],
                "shape": content["shape"],
                "dtype": content.get("dtype"),
            }
            for _, content, _ in layer["tensors"].values()
        ),
        key=_tensor_order,
    )
    steps = [series.max_step for _, _, series in layer["tensors"].values() if series.max_step is not None]
    return {
        "layer": name,
        "layer_index": info["layer_index"],
        "layer_class": info.get("layer_class"),
        "layer_dtype": info.get("layer_dtype"),
        # Files written before other backends existed came from TensorFlow.
        "backend": info.get("backend", "tensorflow"),
        "device": info.get("device"),
        "pooling": pooling,
        "tensors": tensors,
        "max_step": max(steps) if steps else None,
    }


def _histogram_columns(histograms, steps):
    """The linear histograms (a `_Series` or None) aligned with `steps`, None where missing."""
    empty = [None] * len(steps)
    result = {"buckets": fmt.HISTOGRAM_BUCKETS, "low": empty, "high": list(empty), "counts": list(empty)}
    if histograms is None or not len(steps):
        return result
    # The last record of a step wins, as the stats rows are also sorted stably by step.
    row_of_step = {step: row for row, step in enumerate(histograms.steps.tolist())}
    rows = [row_of_step.get(step) for step in steps.tolist()]
    low = histograms.values[:, 0, 0].tolist()
    high = histograms.values[:, -1, 1].tolist()
    counts = histograms.values[:, :, 2].astype(np.int64).tolist()
    result["low"] = [None if row is None else low[row] for row in rows]
    result["high"] = [None if row is None else high[row] for row in rows]
    result["counts"] = [None if row is None else counts[row] for row in rows]
    return result


def _stats_at(values):
    """The stats record of one row as a dict of scalars (counts as ints)."""
    result = {}
    for i, name in enumerate(fmt.STATS_FIELDS):
        result[name] = int(values[i]) if name in _COUNT_FIELDS else float(values[i])
    return result


def _routing_at(values, dtype):
    result = {}
    for name, value in zip(fmt.ROUTING_FIELDS, values.tolist()):
        is_count = name in _ROUTING_COUNT_FIELDS and np.isfinite(value)
        result[name] = int(value) if is_count else value
    result["mass"] = fmt.mass_conservation(fmt.decode_routing(values), dtype)
    return result


def _routing_columns(values):
    """The routing records as one list per field (counts as ints, NaN kept)."""
    result = {}
    for i, name in enumerate(fmt.ROUTING_FIELDS):
        column = values[:, i]
        if name in _ROUTING_COUNT_FIELDS:
            result[name] = [int(v) if np.isfinite(v) else v for v in column.tolist()]
        else:
            result[name] = column.tolist()
    return result


def _frontend_dir():
    """Returns the folder of the `tb_gradviz.frontend` package, or None.

    pyproject maps the top-level `frontend/` folder to this package: an
    editable install resolves it there, a wheel puts it under `tb_gradviz/`.
    The paths after it cover a source checkout that is not installed.
    """
    try:
        spec = importlib.util.find_spec("tb_gradviz.frontend")
    except ImportError:
        spec = None
    candidates = list(spec.submodule_search_locations or []) if spec else []
    here = os.path.dirname(os.path.abspath(__file__))
    candidates += [os.path.join(here, "frontend"), os.path.join(os.path.dirname(here), "frontend")]
    return next((path for path in candidates if os.path.isdir(path)), None)


def _static_file(root, relative):
    """Returns the real path of `relative` inside `root`, or None to answer 404.

    Refuses absolute paths, empty, `.` and `..` components, hidden files,
    backslashes, NUL and colons (Windows drives and streams), unknown file
    types, and anything whose real path (symlinks resolved) leaves `root`.
    """
    if root is None or not relative or len(relative) > 512:
        return None
    parts = relative.split("/")
    for part in parts:
        if not part or part.startswith(".") or any(c in part for c in "\\\0:"):
            return None
    real_root = os.path.realpath(root)
    path = os.path.realpath(os.path.join(real_root, *parts))
    if os.path.commonpath([real_root, path]) != real_root or not os.path.isfile(path):
        return None
    # The type of the file served, after symlinks, decides.
    if os.path.splitext(path)[1].lower() not in _STATIC_TYPES:
        return None
    return path


def _check_method(request):
    if request.method not in _ALLOWED_METHODS:
        raise _MethodNotAllowedError(request.method)


def _single_arg(request, name, required=True):
    """Returns a query argument given at most once.

    Raises:
      InvalidArgumentError: the argument is missing (when required) or repeated.
    """
    values = request.args.getlist(name)
    if len(values) > 1:
        raise errors.InvalidArgumentError(f"query argument {name!r} given {len(values)} times; give it once")
    if not values:
        if required:
            raise errors.InvalidArgumentError(f"missing query argument {name!r}")
        return None
    return values[0]


def _parse_step(text):
    """Parses a step argument, clamped to int64 (steps are int64).

    Raises:
      InvalidArgumentError: `text` is not a decimal integer.
    """
    if not _STEP_PATTERN.fullmatch(text):
        raise errors.InvalidArgumentError(f"step must be a decimal integer; received {text[:40]!r}")
    return min(max(int(text), _INT64_MIN), _INT64_MAX)


class GradVizPlugin(base_plugin.TBPlugin):
    """Serves the GradViz tab: per-layer activations and gradients over steps."""

    plugin_name = metadata.PLUGIN_NAME

    def __init__(self, context, frontend_dir=None):
        """Instantiates the plugin; TensorBoard calls it with its context.

        Args:
          context: a `base_plugin.TBContext`; only `data_provider` is used.
          frontend_dir: the folder of the static files; defaults to the
            installed `tb_gradviz.frontend` package (tests pass their own).
        """
        self._data_provider = context.data_provider
        self._frontend_dir = frontend_dir if frontend_dir is not None else _frontend_dir()
        self._cache = _SeriesCache()
        # Listings of gradviz series, each under its own (max_step, max_wall_time).
        self._listings = _SeriesCache(max_series=_CACHE_MAX_LISTINGS)
        # /series reads a tensor's stats and its histograms at once: each read
        # of the Rust data server has a fixed wait however small the answer
        # (bench/RESULTS.md, section 4).
        self._readers = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="gradviz-read")

    def get_plugin_apps(self):
        return {
            "/runs": self._serve_runs,
            "/series": self._serve_series,
            "/routing": self._serve_routing,
            "/step": self._serve_step,
            _STATIC_ROUTE + "/*": self._serve_static,
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
        return base_plugin.FrontendMetadata(es_module_path=_STATIC_ROUTE + "/index.js", tab_name="GradViz")

    # Data access.

    def _list(self, ctx, experiment, plugin_name, run=None, tag=None):
        run_tag_filter = provider.RunTagFilter(
            runs=None if run is None else [run], tags=None if tag is None else [tag]
        )
        return self._data_provider.list_tensors(
            ctx, experiment_id=experiment, plugin_name=plugin_name, run_tag_filter=run_tag_filter
        )

    def _list_one(self, ctx, experiment, plugin_name, run, tag):
        """Returns the `provider.TensorTimeSeries` of one run and tag, or None."""
        return self._list(ctx, experiment, plugin_name, run=run, tag=tag).get(run, {}).get(tag)

    def _read(self, ctx, experiment, plugin_name, run, time_series_by_tag, row_shape, count_columns, min_length=None):
        """Returns `{tag: _Series}` for the given series of one run, from cache when current.

        Args:
          time_series_by_tag: `{tag: provider.TensorTimeSeries}` as listed
            just before; their `(max_step, max_wall_time)` validate the cache.
          row_shape, count_columns, min_length: the record layout (see
            `_decode_series`).
        """
        layout = (row_shape, count_columns, min_length)
        return self._read_cached(ctx, experiment, plugin_name, run, time_series_by_tag, layout, _ALL_SAMPLES)[0]

    def _read_cached(self, ctx, experiment, plugin_name, run, time_series_by_tag, layout, downsample, accept=None):
        """Reads and decodes the series not cached for this listing; caches what `accept`s.

        Args:
          layout: `(row_shape, count_columns, min_length)` for `_decode_series`.
          downsample: what to ask the provider for; series read with
            different `downsample` are cached apart.
          accept: None, or `(series, time_series) -> bool`; a decoded series
            it refuses is neither cached nor returned.

        Returns:
          `({tag: _Series}, {tag: time_series refused by accept})`.
        """
        result, stale, refused = {}, {}, {}
        for tag, time_series in time_series_by_tag.items():
            series = self._cache.get((experiment, plugin_name, run, tag, downsample), _version(time_series))
            if series is None:
                stale[tag] = time_series
            else:
                result[tag] = series
        data = self._read_points(ctx, experiment, plugin_name, run, sorted(stale), downsample)
        for tag, time_series in stale.items():
            series = _decode_series(data.get(tag, []), *layout)
            if accept is not None and not accept(series, time_series):
                refused[tag] = time_series
                continue
            self._cache.put((experiment, plugin_name, run, tag, downsample), _version(time_series), series)
            result[tag] = series
        return result, refused

    def _read_points(self, ctx, experiment, plugin_name, run, tags, downsample):
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
                self._data_provider.read_tensors(
                    ctx,
                    experiment_id=experiment,
                    plugin_name=plugin_name,
                    downsample=downsample,
                    run_tag_filter=provider.RunTagFilter(runs=[run], tags=tags[start : start + batch]),
                ).get(run, {})
            )
        return data

    def _read_at(self, ctx, experiment, plugin_name, run, time_series_by_tag, limit, row_shape, count_columns,
                 min_length=None):
        """Like `_read`, for `/step`: series whose rows up to `limit` are all that is needed.

        A series whose last step is `<= limit`, and whose full decoding is not
        cached, is read as its last point alone (the provider always keeps
        it): the grid at the latest step of 200 layers x 1000 steps reads 800
        points, not 800 000. Any other series is read whole, through `_read`.
        """
        layout = (row_shape, count_columns, min_length)
        result, full, last_only = {}, {}, {}
        for tag, time_series in time_series_by_tag.items():
            cached = self._cache.get((experiment, plugin_name, run, tag, _ALL_SAMPLES), _version(time_series))
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
            ctx, experiment, plugin_name, run, last_only, layout, 1, accept=is_listed_last_point
        )
        result.update(last)
        full.update(refused)
        result.update(self._read(ctx, experiment, plugin_name, run, full, *layout))
        return result

    def _run_layers(self, ctx, experiment, run):
        """The layer index of one run (see `_layer_index`).

        Raises:
          NotFoundError: the run holds no tb_gradviz data.
        """
        listing = self._list(ctx, experiment, metadata.PLUGIN_NAME, run=run)
        self._remember_listings(experiment, listing)
        layers = _layer_index(listing.get(run) or {})
        if not layers:
            raise errors.NotFoundError(f"no tb_gradviz data in run {run!r}")
        return layers

    # Implementations: plain data in, plain data out.

    def runs_impl(self, ctx, experiment):
        """Returns the `/runs` body: runs with tb_gradviz data and their layers.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.

        Returns:
          `{"runs": [{"run", "layers"}]}`, runs by name, layers by `layer_index`.
        """
        runs = []
        listing = self._list(ctx, experiment, metadata.PLUGIN_NAME)
        self._remember_listings(experiment, listing)
        for run, time_series_by_tag in sorted(listing.items()):
            layers = _layer_index(time_series_by_tag)
            if not layers:
                continue
            summaries = [_layer_summary(name, layer) for name, layer in layers.items()]
            summaries.sort(key=lambda layer: (layer["layer_index"], layer["layer"]))
            runs.append({"run": run, "layers": summaries})
        return {"runs": runs}

    def series_impl(self, ctx, experiment, run, layer, tensor):
        """Returns the `/series` body: every step the provider holds of one tensor.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run, layer, tensor: names as `/runs` gives them.

        Returns:
          A dict as described in docs/API.md.

        Raises:
          NotFoundError: no such run, layer or tensor.
        """
        tag = fmt.stats_tag(layer, tensor)
        histogram_tag = fmt.histogram_tag(layer, tensor)
        histogram_series = self._list_one(ctx, experiment, histogram_metadata.PLUGIN_NAME, run, histogram_tag)
        time_series = self._list_stats(ctx, experiment, run, tag, histogram_series)
        content = _parse_content(time_series) if time_series is not None else None
        if (
            content is None
            or content["kind"] != metadata.KIND_TENSOR
            or content["layer"] != layer
            or content["tensor"] != tensor
        ):
            raise errors.NotFoundError(f"no tensor {tensor!r} of layer {layer!r} in run {run!r}")
        histograms = self._readers.submit(
            self._read_histograms,
            ctx,
            experiment,
            run,
            content["histogram_tag"],
            histogram_series if content["histogram_tag"] == histogram_tag else None,
        )
        stats = self._read(
            ctx, experiment, metadata.PLUGIN_NAME, run, {tag: time_series}, (fmt.STATS_LENGTH,), _stats_counts
        )[tag]
        values = stats.values
        return {
            "run": run,
            "layer": layer,
            "tensor": tensor,
            "role": content["role"],
            "shape": content["shape"],
            "dtype": content.get("dtype"),
            "steps": stats.steps.tolist(),
            "wall_times": stats.wall_times.tolist(),
            "stats": {
                name: (values[:, i].astype(np.int64) if name in _COUNT_FIELDS else values[:, i]).tolist()
                for i, name in enumerate(fmt.STATS_FIELDS)
            },
            "histogram": _histogram_columns(histograms.result(), stats.steps),
            "log": {
                "edges": _LOG_EDGES,
                "negative": values[:, _NEGATIVE_BINS].astype(np.int64).tolist(),
                "positive": values[:, _POSITIVE_BINS].astype(np.int64).tolist(),
            },
        }

    def _list_stats(self, ctx, experiment, run, tag, histogram_series):
        """Lists a stats or routing series, reusing its last listing while a sibling histogram is unchanged.

        With the Rust data server, listing a `gradviz` series (its metadata
        is a JSON object) is two orders of magnitude slower than listing its
        `histograms` sibling (bench/RESULTS.md, section 4). Both are written in the same events (docs/FORMAT.md), so
        new stats points change the histogram's `(max_step, max_wall_time)`
        too, and an unchanged histogram listing means an unchanged stats one.

        Returns:
          The stats series' `provider.TensorTimeSeries`, or None.
        """
        if histogram_series is None:
            return self._list_one(ctx, experiment, metadata.PLUGIN_NAME, run, tag)
        time_series = self._listings.get((experiment, run, tag), _version(histogram_series))
        if time_series is None:
            # One call lists the whole run for about what one tag costs.
            listing = self._list(ctx, experiment, metadata.PLUGIN_NAME, run=run)
            self._remember_listings(experiment, listing)
            time_series = listing.get(run, {}).get(tag)
        return time_series

    def _remember_listings(self, experiment, listing):
        """Caches each series of a `list_tensors` answer under its own version.

        A stats series and its histogram sibling get their points from the
        same events, so their versions are equal: `_list_stats` finds an entry
        only while the sibling's listing says nothing has been added since.
        """
        for run, time_series_by_tag in listing.items():
            for tag, time_series in time_series_by_tag.items():
                self._listings.put((experiment, run, tag), _version(time_series), time_series)

    def _read_histograms(self, ctx, experiment, run, tag, time_series):
        """The `_Series` of a tensor's linear histograms, or None.

        Args:
          time_series: the histogram series as listed, or None to list it here.
        """
        if time_series is None:
            time_series = self._list_one(ctx, experiment, histogram_metadata.PLUGIN_NAME, run, tag)
        if time_series is None:
            return None
        buckets = fmt.HISTOGRAM_BUCKETS
        return self._read(
            ctx, experiment, histogram_metadata.PLUGIN_NAME, run, {tag: time_series}, (buckets, 3), _histogram_counts
        )[tag]

    def routing_impl(self, ctx, experiment, run, layer):
        """Returns the `/routing` body: the routing records of a pooling layer.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run, layer: names as `/runs` gives them.

        Returns:
          A dict as described in docs/API.md.

        Raises:
          NotFoundError: no such run or layer, or the layer is not a pooling layer.
        """
        tag = fmt.routing_tag(layer)
        # Routing is recorded only for one-input pooling layers, in the same
        # events as their `input_gradient` histogram: its (cheap) listing
        # validates the last listing of the routing series.
        histogram_series = self._list_one(
            ctx, experiment, histogram_metadata.PLUGIN_NAME, run, fmt.histogram_tag(layer, fmt.INPUT_GRADIENT)
        )
        time_series = self._list_stats(ctx, experiment, run, tag, histogram_series)
        content = _parse_content(time_series) if time_series is not None else None
        if content is None or content["kind"] != metadata.KIND_ROUTING or content["layer"] != layer:
            raise errors.NotFoundError(f"no routing record of layer {layer!r} in run {run!r} (not a pooling layer?)")
        routing = self._read(
            ctx, experiment, metadata.PLUGIN_NAME, run, {tag: time_series}, _ROUTING_SHAPE, _routing_counts,
            _ROUTING_MIN_LENGTH,
        )[tag]
        verdicts = [fmt.mass_conservation(fmt.decode_routing(row), content.get("layer_dtype")) for row in routing.values]
        return dict(
            {"run": run, "layer": layer, "pooling": content.get("pooling"), "steps": routing.steps.tolist()},
            **_routing_columns(routing.values),
            mass={key: [v[key] for v in verdicts] for key in ("difference", "relative", "tolerance", "conserved")},
        )

    def step_impl(self, ctx, experiment, run, step=None):
        """Returns the `/step` body: every layer of a run at its latest step `<= step`.

        Args:
          ctx: the request's `tensorboard.context.RequestContext`.
          experiment: the experiment id.
          run: a run name.
          step: an int, or None for each layer's last step.

        Returns:
          A dict as described in docs/API.md. Layers without a step `<= step`
          are left out.

        Raises:
          NotFoundError: no such run, or no layer has a step `<= step`.
        """
        layers = self._run_layers(ctx, experiment, run)
        limit = _INT64_MAX if step is None else step
        stats_series = {tag: ts for layer in layers.values() for tag, _, ts in layer["tensors"].values()}
        routing_series = {layer["routing"][0]: layer["routing"][2] for layer in layers.values() if layer["routing"]}
        stats = self._read_at(
            ctx, experiment, metadata.PLUGIN_NAME, run, stats_series, limit, (fmt.STATS_LENGTH,), _stats_counts
        )
        routing = self._read_at(
            ctx, experiment, metadata.PLUGIN_NAME, run, routing_series, limit, _ROUTING_SHAPE, _routing_counts,
            _ROUTING_MIN_LENGTH,
        )
        snapshots = []
        for name, layer in layers.items():
            snapshot = self._layer_snapshot(name, layer, stats, routing, limit)
            if snapshot is not None:
                snapshots.append((layer["info"]["layer_index"], name, snapshot))
        if not snapshots:
            raise errors.NotFoundError(f"run {run!r} has no step <= {limit}")
        snapshots.sort(key=lambda entry: entry[:2])
        return {
            "run": run,
            "step": max(snapshot["step"] for _, _, snapshot in snapshots),
            "layers": [snapshot for _, _, snapshot in snapshots],
            "log_edges": _LOG_EDGES,
        }

    def _layer_snapshot(self, name, layer, stats, routing, limit):
        """One layer of `/step`: its latest step `<= limit` and each record's value there."""
        found = {}
        for tensor, (tag, content, _) in layer["tensors"].items():
            series = stats[tag]
            row = series.index_at_or_before(limit)
            if row is not None:
                found[tensor] = (content, series, row)
        if not found:
            return None
        step = max(int(series.steps[row]) for _, series, row in found.values())
        tensors = {}
        for tensor, (content, series, row) in sorted(found.items(), key=lambda item: _tensor_order(item[1][0])):
            values = series.values[row]
            tensors[tensor] = {
                "step": int(series.steps[row]),
                "stats": _stats_at(values),
                "log": {
                    "negative": values[_NEGATIVE_BINS].astype(np.int64).tolist(),
                    "positive": values[_POSITIVE_BINS].astype(np.int64).tolist(),
                },
            }
        routing_at = None
        if layer["routing"] is not None:
            series = routing[layer["routing"][0]]
            row = series.index_at_or_before(step)
            if row is not None:
                dtype = layer["routing"][1].get("layer_dtype")
                routing_at = dict(_routing_at(series.values[row], dtype), step=int(series.steps[row]))
        return {
            "layer": name,
            "layer_index": layer["info"]["layer_index"],
            "layer_class": layer["info"].get("layer_class"),
            "step": step,
            "tensors": tensors,
            "routing": routing_at,
        }

    # Routes: read the request, call an *_impl, respond.

    @wrappers.Request.application
    def _serve_runs(self, request):
        _check_method(request)
        ctx = plugin_util.context(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        return http_util.Respond(request, self.runs_impl(ctx, experiment), _JSON)

    @wrappers.Request.application
    def _serve_series(self, request):
        _check_method(request)
        run = _single_arg(request, "run")
        layer = _single_arg(request, "layer")
        tensor = _single_arg(request, "tensor")
        ctx = plugin_util.context(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        return http_util.Respond(request, self.series_impl(ctx, experiment, run, layer, tensor), _JSON)

    @wrappers.Request.application
    def _serve_routing(self, request):
        _check_method(request)
        run = _single_arg(request, "run")
        layer = _single_arg(request, "layer")
        ctx = plugin_util.context(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        return http_util.Respond(request, self.routing_impl(ctx, experiment, run, layer), _JSON)

    @wrappers.Request.application
    def _serve_step(self, request):
        _check_method(request)
        run = _single_arg(request, "run")
        step = _single_arg(request, "step", required=False)
        step = None if step is None else _parse_step(step)
        ctx = plugin_util.context(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        return http_util.Respond(request, self.step_impl(ctx, experiment, run, step), _JSON)

    @wrappers.Request.application
    def _serve_static(self, request):
        _check_method(request)
        # `request.path` is already percent-decoded, so `%2e%2e` arrives as
        # `..` and is refused by the guard like a literal one.
        if not request.path.startswith(_STATIC_URL_PREFIX):
            raise errors.NotFoundError("no such static file")
        path = _static_file(self._frontend_dir, request.path[len(_STATIC_URL_PREFIX) :])
        if path is None:
            raise errors.NotFoundError("no such static file")
        with open(path, "rb") as static_file:
            content = static_file.read()
        content_type = _STATIC_TYPES[os.path.splitext(path)[1].lower()]
        return http_util.Respond(request, content, content_type)
