"""The tb_gradviz TensorBoard plugin: serves the "GradViz" tab and its data.

Imports neither TensorFlow nor Keras: TensorBoard imports every installed
plugin at start, and one failing import stops TensorBoard. Data is read only
through `context.data_provider` (`store`), so both loaders work (the Python
multiplexer with `--load_fast=false` and the Rust data server); the answers
are built by `responses`. The HTTP API is described in docs/API.md, the
records it reads in docs/FORMAT.md.
"""

import importlib.resources
import os
import re

from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from tensorboard.plugins.histogram import metadata as histogram_metadata
from werkzeug import wrappers

from tb_gradviz.board import health, onset, responses, series, store, timeline
from tb_gradviz.format import digest, metadata, records

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


class _MethodNotAllowedError(errors.PublicError):
    """A request with a method other than GET or HEAD (HTTP 405).

    TensorBoard routes every method to a plugin's handlers, so the plugin
    checks it itself.
    """

    http_code = 405

    def __init__(self, method):
        super().__init__(
            f"Method not allowed: {method}; this route answers {', '.join(_ALLOWED_METHODS)}"
        )
        self.headers = [("Allow", ", ".join(_ALLOWED_METHODS))]


def _frontend_dir():
    """Returns the folder of the installed `tb_gradviz.board.frontend` package.

    pyproject installs the top-level `frontend/` folder as this package, in
    a wheel and in an editable install alike.
    """
    return str(importlib.resources.files("tb_gradviz.board.frontend"))


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
        raise errors.InvalidArgumentError(
            f"query argument {name!r} given {len(values)} times; give it once"
        )
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


def _parse_ratio(text):
    """Parses the flags' ratio: a finite number above 1.

    Raises:
      InvalidArgumentError: anything else.
    """
    try:
        ratio = float(text[:40])
    except ValueError:
        ratio = float("nan")
    if not 1 < ratio < float("inf"):
        raise errors.InvalidArgumentError(
            f"ratio must be a finite number above 1; received {text[:40]!r}"
        )
    return ratio


_OPTIONAL_ARGS = {
    "step": _parse_step,
    "ratio": _parse_ratio,
    "width": timeline.parse_width,
    "field": timeline.parse_field,
    "role": timeline.parse_role,
}


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
        self._frontend_dir = frontend_dir if frontend_dir is not None else _frontend_dir()
        self._caches = series.Caches()

    def get_plugin_apps(self):
        return {
            "/runs": self._json_route(self.runs_impl),
            "/series": self._json_route(self.series_impl, ("run", "layer", "tensor")),
            "/routing": self._json_route(self.routing_impl, ("run", "layer")),
            "/step": self._json_route(self.step_impl, ("run",), ("step", "ratio")),
            "/routing_map": self._json_route(self.routing_map_impl, ("run", "layer"), ("step",)),
            "/updates": self._json_route(self.updates_impl, ("run", "layer")),
            "/timeline": self._json_route(
                self.timeline_impl, ("run",), ("field", "role", "width", "ratio")
            ),
            "/onset": self._json_route(self.onset_impl, ("run",), ("ratio",)),
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
        return base_plugin.FrontendMetadata(
            es_module_path=_STATIC_ROUTE + "/index.js", tab_name="GradViz"
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
        return responses.series_body(
            run, content, stats, histograms.result()[histogram_tag] if histograms else None
        )

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
        run_store = self._store(ctx, experiment, run)
        content, time_series = run_store.routing(layer)
        tag = records.routing_tag(layer)
        return responses.routing_body(
            run, content, run_store.read({tag: time_series}, records.ROUTING)[tag]
        )

    def step_impl(self, ctx, experiment, run, step=None, ratio=health.DEFAULT_RATIO):
        """Returns the `/step` body: every layer of a run at its latest step `<= step`, with its flags.

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
        limit = _INT64_MAX if step is None else step
        series_by_kind = _series_by_kind(
            layers, lambda found, layout: run_store.read_at(found, layout, limit)
        )
        body = responses.step_body(run, layers, series_by_kind, limit, ratio)
        if body is None:
            where = "logged step" if step is None else f"step <= {step}"
            raise errors.NotFoundError(f"run {run!r} has no {where}")
        return body

    def onset_impl(self, ctx, experiment, run, ratio=health.DEFAULT_RATIO):
        """Returns the `/onset` body: where each flag was first raised in a run (`onset`).

        Raises:
          NotFoundError: no such run, or it has no logged step.
        """
        run_store = self._store(ctx, experiment, run)
        layers = run_store.layers()
        body = onset.onset_body(run, layers, _series_by_kind(layers, run_store.read), ratio)
        if body is None:
            raise errors.NotFoundError(f"run {run!r} has no logged step")
        return body

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
          A dict as described in docs/API.md.

        Raises:
          NotFoundError: no such run, or it has no digest (written before digests).
        """
        run_store = self._store(ctx, experiment, run)
        digests = [
            (rows, run_store.read({tag: ts}, timeline.digest_layout(rows), digest.PLUGIN_NAME)[tag])
            for tag, (rows, ts) in run_store.digests().items()
        ]
        body = timeline.timeline_body(run, digests, field, role, width, ratio)
        if body is None:
            raise errors.NotFoundError(
                f"run {run!r} has no digest (it was written by a tb_gradviz without one)"
            )
        return body

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

    def routing_map_impl(self, ctx, experiment, run, layer, step=None):
        """Returns the `/routing_map` body: a pooling layer's routing map at its latest step `<= step`.

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
        limit = _INT64_MAX if step is None else step
        body = responses.routing_map_body(
            run, content, run_store.read({tag: time_series}, records.ROUTING_MAP)[tag], limit
        )
        if body is None:
            raise errors.NotFoundError(
                f"layer {layer!r} of run {run!r} has no routing map at a step <= {limit}"
            )
        return body

    # Routes: read the request, call an *_impl, respond.

    def _json_route(self, impl, required=(), optional=()):
        """A route that reads `required` and `optional` query arguments and answers `impl`'s data as JSON.

        `impl(ctx, experiment, *required, **optional)`; optional arguments
        are parsed by `_OPTIONAL_ARGS` and left to the impl's defaults when
        absent.
        """

        @wrappers.Request.application
        def serve(request):
            _check_method(request)
            args = [_single_arg(request, name) for name in required]
            kwargs = {}
            for name in optional:
                text = _single_arg(request, name, required=False)
                if text is not None:
                    kwargs[name] = _OPTIONAL_ARGS[name](text)
            ctx = plugin_util.context(request.environ)
            experiment = plugin_util.experiment_id(request.environ)
            return http_util.Respond(request, impl(ctx, experiment, *args, **kwargs), _JSON)

        return serve

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
