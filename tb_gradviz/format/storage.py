"""Where a run's event files go: a local folder, a `file://` URL, or an object store.

A local path or a `file://` URL is written with Python's own file calls. A
remote URL (`gs://`, `s3://`, or any protocol fsspec knows) is written through
the file layer TensorBoard reads it with: TensorFlow's `tf.io.gfile` when
TensorFlow is already imported and knows the scheme (TensorFlow 2.21 knows
`gs://`, not `s3://`), TensorBoard's own TensorFlow-free gfile otherwise
(boto3 for `s3://`, fsspec for the rest). Nothing here imports TensorFlow,
and nothing in `location` touches the network. A remote run's files go up
through `upload.Uploader`.
"""

import dataclasses
import os
import re
import sys
import threading
import urllib.parse
import urllib.request

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# pathlib.Path("s3://b/run") is "s3:/b/run": a URL that lost a slash.
_MANGLED_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")
# The packages of the `remote` extra, named so that the hint works however tb_gradviz was installed.
REMOTE_EXTRA = 'pip install "boto3>=1.28" "fsspec>=2023.1" (the remote extra)'


@dataclasses.dataclass(frozen=True)
class Location:
    """A run directory: a local folder (`local_path`), or a URL and the file layer that writes it.

    Attributes:
      url: the directory as given (a trailing `/` dropped from a remote URL).
      local_path: the local folder, for a local path or a `file://` URL;
        None for a remote URL.
      layer: the `FileLayer` that writes a remote URL; None for a local one.
    """

    url: str
    local_path: str | None = None
    layer: "FileLayer | None" = None

    @property
    def is_remote(self):
        return self.local_path is None

    def join(self, name):
        """The URL (or local path) of the file `name` inside this directory."""
        if self.is_remote:
            return f"{self.url}/{name}"
        return os.path.join(self.local_path, name)


def location(path, what="log_dir"):
    """Returns the `Location` of a run directory given as a path or URL.

    Looks only at the text and at which packages are importable: never at
    the network, so it returns at once for any URL. Whether a remote
    directory can be written is found at the first upload.

    Args:
      path: a local path (str or os.PathLike), a `file://` URL, or a remote
        URL such as `gs://bucket/run` or `s3://bucket/run`.
      what: the argument's name, for messages.

    Raises:
      TypeError: `path` is not a str or os.PathLike.
      ValueError: the path is empty, a URL is malformed or names a scheme no
        installed file layer writes; the message repeats what was received.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (str or os.PathLike); received {path!r}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a path (str or os.PathLike); received {path!r}")
    if not text:
        raise ValueError(f"{what} must be a non-empty path; received ''")
    if "::" in text and "://" in text:
        raise ValueError(f"{what} must be one URL; received {text!r}, a chained fsspec URL")
    match = _SCHEME.match(text)
    if match is None:
        mangled = _MANGLED_URL.match(text)
        if mangled:
            scheme = mangled.group(1)
            raise ValueError(
                f"{what} {text!r} looks like a URL that lost a slash ('{scheme}:/' instead of "
                f"'{scheme}://', as pathlib.Path makes of one): pass a URL as a str"
            )
        return Location(url=text, local_path=text)
    scheme = match.group(1).lower()
    if scheme == "file":
        return Location(url=text, local_path=_file_url_path(text, what))
    if not urllib.parse.urlsplit(text).netloc:
        raise ValueError(
            f"{what} {text!r} names no bucket or host: expected {scheme}://BUCKET/path"
        )
    url = text.rstrip("/")
    layer = file_layer(url, scheme, what)
    if layer.name == "tensorboard gfile" and scheme == "s3" and not urllib.parse.urlsplit(url).path:
        # Its S3 layer splits bucket and key at the first '/' after the bucket.
        raise ValueError(
            f"{what} {text!r} is a bucket's root, which TensorBoard's s3:// reader cannot list: "
            f"name a folder in it, e.g. {url}/runs"
        )
    return Location(url=url, layer=layer)


def _file_url_path(url, what):
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost") or not parts.path:
        raise ValueError(
            f"{what} {url!r} is not a local path: a file:// URL names one as file:///absolute/path"
        )
    return urllib.request.url2pathname(parts.path)


class FileLayer:
    """Writes and lists objects through one of TensorBoard's file layers.

    Attributes:
      name: `"tf.io.gfile"` or `"tensorboard gfile"`, for messages.
    """

    def __init__(self, name, write, isdir):
        self.name = name
        self._write = write
        self._isdir = isdir

    def write(self, url, data):
        """Puts `data` (bytes) as the whole object `url`, replacing any older one."""
        self._write(url, data)

    def isdir(self, url):
        """Whether `url` is a directory (for object stores: whether objects lie under it)."""
        return self._isdir(url)


def file_layer(url, scheme, what="log_dir"):
    """Returns the `FileLayer` that TensorBoard would read `url` with.

    `tf.io.gfile` if TensorFlow is already imported and knows the scheme
    (never imported here: on JAX and PyTorch no TensorFlow is needed);
    TensorBoard's TensorFlow-free gfile otherwise, which reads `s3://` with
    boto3 (endpoint: `S3_ENDPOINT` as it is now, else boto3's own settings
    such as `AWS_ENDPOINT_URL`) and every other protocol with fsspec.
    Creates no client and touches no network.

    Raises:
      ValueError: no installed file layer writes `scheme`; the message names
        the package to install.
    """
    tf = sys.modules.get("tensorflow")
    registered = getattr(
        getattr(getattr(tf, "io", None), "gfile", None), "get_registered_schemes", None
    )
    if registered is not None and scheme in registered():
        gfile = tf.io.gfile

        def write(url, data):
            with gfile.GFile(url, "wb") as stream:
                stream.write(data)

        return FileLayer("tf.io.gfile", write, gfile.isdir)

    from tensorboard.compat.tensorflow_stub.io import gfile

    try:
        filesystem = gfile.get_filesystem(url)
    except ImportError as e:
        # fsspec knows the protocol; its implementation is not installed.
        raise ValueError(
            f"{what} {url!r} cannot be written here: {e} (TensorBoard reads {scheme}:// "
            f"through fsspec; {REMOTE_EXTRA} and the fsspec package for {scheme}://)"
        ) from None
    except ValueError as e:
        hint = f"{REMOTE_EXTRA} (boto3 for s3://, fsspec for the rest)"
        if gfile.FSSPEC_ENABLED:
            hint = f"fsspec says: {e}" if scheme != "s3" else f"{REMOTE_EXTRA} (boto3)"
        raise ValueError(
            f"{what} {url!r}: no installed file layer writes {scheme}:// URLs; {hint}"
        ) from None
    if type(filesystem) is getattr(gfile, "S3FileSystem", None):
        return _s3_layer(gfile)
    return FileLayer(
        "tensorboard gfile",
        lambda url, data: filesystem.write(url, data, binary_mode=True),
        filesystem.isdir,
    )


def _s3_layer(gfile):
    """TensorBoard's S3 layer, with one boto3 client for the uploads.

    Its `write` is `put_object` on a client made per call, which costs CPU
    each time (measured in bench/RESULTS.md, section 8); the uploads make the same
    call on one client, made as TensorBoard makes its own: endpoint
    `S3_ENDPOINT`, read now (TensorBoard reads it at import), else boto3's
    own settings. Clients come from one session of tb_gradviz's own, made
    and used under a lock (boto3's default session is not thread-safe).
    """
    filesystem = gfile.S3FileSystem()
    endpoint = os.environ.get("S3_ENDPOINT")
    clients = []

    def write(url, data):
        if not clients:
            clients.append(_boto3_client(endpoint))
        bucket, key = filesystem.bucket_and_path(url)
        clients[0].put_object(Body=data, Bucket=bucket, Key=key)

    return FileLayer("tensorboard gfile", write, filesystem.isdir)


_boto3_sessions = []
_boto3_lock = threading.Lock()


def _boto3_client(endpoint):
    with _boto3_lock:
        if not _boto3_sessions:
            import boto3

            _boto3_sessions.append(boto3.session.Session())
        return _boto3_sessions[0].client("s3", endpoint_url=endpoint)
