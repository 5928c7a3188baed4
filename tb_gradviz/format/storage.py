"""Where a run's event files go: a local folder, a `file://` URL, or an object store.

A local path or a `file://` URL is written with Python's own file calls. A
remote URL (`gs://`, `s3://`, or any protocol fsspec knows) is written through
the file layer TensorBoard reads it with: TensorFlow's `tf.io.gfile` when
TensorFlow is already imported and knows the scheme (TensorFlow 2.21 knows
`gs://`, not `s3://`), TensorBoard's own TensorFlow-free gfile otherwise
(boto3 for `s3://`, fsspec for the rest). Nothing here imports TensorFlow,
and nothing in `location` touches the network.

Object stores have no append. An event file bound for one is written to a
local spool file first, exactly as a local run's file, and an `Uploader`
thread puts the spool file's flushed bytes as one whole object after each
flush: the object is replaced, never appended to, so a reader sees whole
log events only. When the store fails, the events stay in the spool file,
one warning says so, and the upload is retried.
"""

import atexit
import collections
import dataclasses
import logging
import os
import re
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import weakref

logger = logging.getLogger(__name__)

# A failed upload is retried after RETRY_FIRST_S, doubling up to RETRY_MAX_S,
# and at once when the writer closes.
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 60.0
# How long closing the writer (train end) and the interpreter's exit wait for
# uploads in flight; after that the events stay in the spool folder.
CLOSE_TIMEOUT_S = 60.0

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# pathlib.Path("s3://b/run") is "s3:/b/run": a URL that lost a slash.
_MANGLED_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")
REMOTE_EXTRA = 'pip install "tb_gradviz[remote]"'


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


@dataclasses.dataclass
class _Upload:
    size: int  # bytes of the spool file to put
    steps: list  # steps of the log events in those bytes
    final: bool  # the file is closed: delete the spool file once it is up


class Uploader:
    """Uploads a remote run's spool files, each as one whole object, in a background thread.

    `publish(name, size, steps, final)` asks for the first `size` bytes of
    the spool file `name` to be put as the object `name` of the run. Newer
    requests for the same file replace older ones still waiting; files go up
    in the order they were first published, so a reader never sees a newer
    file before an older one is complete. A failed upload warns once (until
    an upload succeeds again), keeps everything in the spool folder and is
    retried after 2 s, doubling up to a minute, and at `close`. Nothing here
    blocks the caller on the network, but `close`, which waits a bounded time.

    What is lost if the process dies: the log events not yet uploaded,
    usually the last one (or all since the store went away); they stay in
    the spool folder, whose files are whole event files to copy into the run.
    """

    def __init__(self, location):
        self.location = location
        self.spool_dir = None
        self._pending = collections.OrderedDict()  # name -> _Upload, oldest first
        self._uploaded_steps = {}  # name -> steps already in the store
        self._uploaded_sizes = {}  # name -> bytes already in the store
        self._cond = threading.Condition()
        self._thread = None
        self._error = None  # the last upload error, while uploads fail
        self._failures = 0
        self._retry_at = 0.0
        self._attempts = 0
        self._hurry = False
        self._closed = False

    def spool(self):
        """The local folder for this run's files (made now if need be); the writer is open until `close`."""
        with self._cond:
            self._closed = False
            if self.spool_dir is None:
                parts = urllib.parse.urlsplit(self.location.url)
                label = re.sub(r"[^A-Za-z0-9.-]+", "-", f"{parts.netloc}{parts.path}").strip("-")[
                    :60
                ]
                self.spool_dir = tempfile.mkdtemp(prefix=f"tb_gradviz-spool-{label}-")
                _spooling_uploaders.add(self)
            os.makedirs(self.spool_dir, exist_ok=True)
            return self.spool_dir

    def publish(self, name, size, steps, final):
        """Asks for the first `size` bytes of spool file `name` (log events at `steps`) to be uploaded."""
        with self._cond:
            self._pending[name] = _Upload(size, list(steps), final)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tb_gradviz-uploader", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def pending_steps(self):
        """Steps of the published log events not yet in the store."""
        with self._cond:
            return [
                s
                for name, u in self._pending.items()
                for s in u.steps[len(self._uploaded_steps.get(name, ())) :]
            ]

    def close(self, timeout=None, at_exit=False):
        """Waits up to `timeout` s (`CLOSE_TIMEOUT_S`) for the uploads; says what is not in the store.

        An upload waiting for its retry is tried at once, and the wait ends
        early when an upload fails. What is left stays in the spool folder
        and is retried in the background while the process runs.

        Returns:
          The steps of the log events not in the store (empty when all are).
        """
        timeout = CLOSE_TIMEOUT_S if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            started = self._attempts
            self._hurry = True
            self._cond.notify_all()
            while self._pending and time.monotonic() < deadline:
                if self._error is not None and self._attempts > started:
                    break
                self._cond.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            error = self._error
        missing = self.pending_steps()
        if missing:
            why = (
                f"the store failed: {_describe(error)}"
                if error is not None
                else f"no answer within {timeout:g} s"
            )
            logger.warning(
                "tb_gradviz: %d log event(s) (steps %s) are not in %s (%s). They are kept in %s, whose "
                "files are whole event files: copy them into %s to complete the run.%s",
                len(missing),
                _steps_text(missing),
                self.location.url,
                why,
                self.spool_dir,
                self.location.url,
                "" if at_exit else " Retried in the background while this process runs.",
            )
        elif self.spool_dir is not None:
            if at_exit:  # a writer never closed (an interrupted fit): its last file is up too
                with self._cond:
                    for name, size in self._uploaded_sizes.items():
                        if _size(os.path.join(self.spool_dir, name)) == size:
                            _remove(os.path.join(self.spool_dir, name))
            _remove_empty(self.spool_dir)
        return missing

    def _run(self):
        while True:
            with self._cond:
                while True:
                    if not self._pending:
                        self._thread = None
                        if self._closed:  # all up after the writer closed: nothing is kept
                            _remove_empty(self.spool_dir)
                        return
                    delay = self._retry_at - time.monotonic()
                    if delay <= 0 or self._hurry:
                        break
                    self._cond.wait(delay)
                self._hurry = False
                name, upload = next(iter(self._pending.items()))
            try:
                with open(os.path.join(self.spool_dir, name), "rb") as stream:
                    data = stream.read(upload.size)
                self.location.layer.write(self.location.join(name), data)
            except Exception as e:  # any store error: keep the events, say so once, retry
                self._failed(e)
                continue
            self._succeeded(name, upload)

    def _failed(self, error):
        with self._cond:
            first = self._error is None
            self._error = error
            self._attempts += 1
            self._failures += 1
            delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (self._failures - 1))
            self._retry_at = time.monotonic() + delay
            self._cond.notify_all()
        if first:
            logger.warning(
                "tb_gradviz: cannot write to %s through %s: %s. Training goes on; the log events are "
                "kept in %s and uploaded when the store answers again (retried after %g s, then up to "
                "every %g s).",
                self.location.url,
                self.location.layer.name,
                _describe(error),
                self.spool_dir,
                delay,
                RETRY_MAX_S,
            )

    def _succeeded(self, name, upload):
        with self._cond:
            recovered = self._error is not None
            self._error = None
            self._failures = 0
            self._retry_at = 0.0
            self._attempts += 1
            self._uploaded_steps[name] = upload.steps
            self._uploaded_sizes[name] = upload.size
            if self._pending.get(name) is upload:
                del self._pending[name]
                if upload.final:
                    del self._uploaded_steps[name], self._uploaded_sizes[name]
                    _remove(os.path.join(self.spool_dir, name))
            self._cond.notify_all()
        if recovered:
            logger.warning(
                "tb_gradviz: %s answers again; the log events kept meanwhile are uploaded in turn.",
                self.location.url,
            )


def _describe(error):
    return f"{type(error).__name__}: {error}"


def _steps_text(steps):
    return (
        ", ".join(map(str, steps))
        if len(steps) <= 6
        else f"{steps[0]}, {steps[1]}, ..., {steps[-1]}"
    )


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


def _remove_empty(folder):
    try:
        os.rmdir(folder)
    except OSError:
        pass


# At exit every uploader that spooled gets a last, bounded chance to upload
# what is left (a fit interrupted before train end, a custom loop that never
# closed its writer, a store that came back after train end), and tidies up.
_spooling_uploaders = weakref.WeakSet()


@atexit.register
def _upload_before_exit():
    for uploader in list(_spooling_uploaders):
        uploader.close(at_exit=True)
