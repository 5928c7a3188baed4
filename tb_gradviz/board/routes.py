"""The plugin's HTTP side: reading query arguments, answering JSON, serving the static files.

Routes are thin: `json_route` reads a request's arguments (`query`), calls an `*_impl`
of the plugin and answers its plain data as JSON through TensorBoard's
`http_util.Respond`; errors are raised as TensorBoard's public errors (400,
404, 405). `static_route` serves the tab's files behind a path guard.
"""

import gzip
import importlib.resources
import json
import os
from typing import NamedTuple

from tensorboard import errors, plugin_util
from tensorboard.backend import http_util, json_util
from werkzeug import wrappers

from tb_gradviz.board import query, series
from tb_gradviz.format import metadata

_JSON = "application/json"
_ALLOWED_METHODS = ("GET", "HEAD")

# Only these files are served from the frontend folder, with these types. The
# module must be `text/javascript`: with any other type the iframe stays blank.
_STATIC_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
}
STATIC_ROUTE = "/static"
_STATIC_URL_PREFIX = f"/data/plugin/{metadata.PLUGIN_NAME}{STATIC_ROUTE}/"


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


def frontend_dir():
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


class _Encoded(NamedTuple):
    body: dict
    # Its gzipped JSON.
    data: bytes


def _encoded_bytes(encoded):
    return len(encoded.data) + series.body_bytes(encoded.body)


class Encodings:
    """The gzipped JSON of the bodies a route answered last, reused for the same body object.

    For an impl that returns a cached body, the same object while its data
    is unchanged (and never changed once returned): answering it again
    costs neither `json.dumps` nor gzip. Holds the last `size` bodies, and
    at most `max_bytes` of them and their encodings (`series.VersionedCache`).
    """

    def __init__(self, size=8, max_bytes=256 << 20):
        # Under the body's id: the entry holds the body, so the id is not reused meanwhile.
        self._entries = series.VersionedCache(size, max_bytes, _encoded_bytes)

    def __len__(self):
        return len(self._entries.keys_by_use())

    def gzipped(self, body):
        """Returns `body` as gzipped JSON, written as `http_util.Respond` writes JSON."""
        entry = self._entries.get(id(body), None)
        if entry is not None and entry.body is body:
            return entry.data
        # NaN and the infinities as strings, ASCII: what Respond sends for a dict.
        text = json.dumps(json_util.Cleanse(body, "utf-8"), ensure_ascii=True)
        data = gzip.compress(text.encode("utf-8"), compresslevel=3, mtime=0)
        self._entries.put(id(body), None, _Encoded(body, data))
        return data


def json_route(impl, required=(), optional=(), encodings=None):
    """A route that reads query arguments and answers `impl`'s data as JSON.

    Calls `impl(ctx, experiment, *required, **optional)` with the
    `required` and `optional` query arguments, each parsed by its parser in
    `query.PARSERS`; optional ones are left to the impl's defaults when
    absent. With
    `encodings` (an `Encodings`), the JSON of a body the impl returns again
    is reused; a client that does not accept gzip gets it unzipped.
    """

    @wrappers.Request.application
    def serve(request):
        _check_method(request)
        args, kwargs = query.arguments(request.args, required, optional)
        ctx = plugin_util.context(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        body = impl(ctx, experiment, *args, **kwargs)
        if encodings is None:
            return http_util.Respond(request, body, _JSON)
        return http_util.Respond(request, encodings.gzipped(body), _JSON, content_encoding="gzip")

    return serve


def static_route(root):
    """A route that serves the tab's files from the folder `root` (404 for anything else)."""

    @wrappers.Request.application
    def serve(request):
        _check_method(request)
        # `request.path` is already percent-decoded, so `%2e%2e` arrives as
        # `..` and is refused by the guard like a literal one.
        if not request.path.startswith(_STATIC_URL_PREFIX):
            raise errors.NotFoundError("no such static file")
        path = _static_file(root, request.path[len(_STATIC_URL_PREFIX) :])
        if path is None:
            raise errors.NotFoundError("no such static file")
        with open(path, "rb") as static_file:
            content = static_file.read()
        content_type = _STATIC_TYPES[os.path.splitext(path)[1].lower()]
        return http_util.Respond(request, content, content_type)

    return serve
