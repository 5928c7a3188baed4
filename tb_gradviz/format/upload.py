"""Uploads a remote run's event files to an object store, in a background thread.

Object stores have no append. An event file bound for one is written to a
local spool file first, exactly as a local run's file, and an `Uploader`
thread puts the spool file's flushed bytes as one whole object after each
flush: the object is replaced, never appended to, so a reader sees whole
log events only. When the store fails, the events stay in the spool file,
one warning says so, and the upload is retried.
"""

import atexit
import collections
import contextlib
import dataclasses
import logging
import os
import re
import tempfile
import threading
import time
import urllib.parse
import weakref

logger = logging.getLogger(__name__)

# A failed upload is retried after RETRY_FIRST_S, doubling up to RETRY_MAX_S,
# and at once when the writer closes.
RETRY_FIRST_S = 2.0
RETRY_MAX_S = 60.0
# How long closing the writer (train end) and the interpreter's exit wait for
# uploads in flight; after that the events stay in the spool folder.
CLOSE_TIMEOUT_S = 60.0


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
        """`location`: the run's remote `storage.Location`."""
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
        """The local folder for this run's files, made now if need be.

        The writer counts as open until `close`.
        """
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
        """Asks for the first `size` bytes of spool file `name` to be uploaded.

        `steps`: the steps of the log events in those bytes.
        """
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
        """Waits up to `timeout` s for the uploads; says what is not in the store.

        `timeout` defaults to `CLOSE_TIMEOUT_S`.

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
                "tb_gradviz: %d log event(s) (steps %s) are not in %s (%s). They are kept in %s, "
                "whose files are whole event files: copy them into %s to complete the run.%s",
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
                "tb_gradviz: cannot write to %s through %s: %s. Training goes on; the log events "
                "are kept in %s and uploaded when the store answers again (retried after %g s, "
                "then up to every %g s).",
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
    with contextlib.suppress(OSError):
        os.remove(path)


def _remove_empty(folder):
    with contextlib.suppress(OSError):
        os.rmdir(folder)


# At exit every uploader that spooled gets a last, bounded chance to upload
# what is left (a fit interrupted before train end, a custom loop that never
# closed its writer, a store that came back after train end), and tidies up.
_spooling_uploaders = weakref.WeakSet()


@atexit.register
def _upload_before_exit():
    for uploader in list(_spooling_uploaders):
        uploader.close(at_exit=True)
