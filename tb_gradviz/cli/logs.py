"""Opening a logdir for the CLI, read as TensorBoard reads it, through the plugin's own impls."""

import os
import sys

from tb_gradviz.cli.status import EXIT_NO_DATA, CommandError
from tb_gradviz.format import storage


def open_logdir(logdir):
    """Returns `(plugin, ctx, experiment)` over the logdir, read as TensorBoard does.

    A `file://` URL is read as its local path; a remote URL (`gs://`,
    `s3://`, any fsspec protocol) through TensorBoard's own file layer, as
    `tensorboard --logdir URL` reads it.

    Raises:
      CommandError: the logdir is missing, not a directory, cannot be read,
        or holds no tb_gradviz data.
    """
    _use_tensorboard_without_tensorflow()
    try:
        where = storage.location(logdir, "logdir")
    except (TypeError, ValueError) as e:
        raise CommandError(str(e)) from None
    if where.is_remote:
        try:
            found = where.layer.isdir(where.url)
        except Exception as e:  # the store's own error: no bucket, no permission, no network
            raise CommandError(
                f"cannot read logdir {logdir!r}: {type(e).__name__}: {e}", EXIT_NO_DATA
            ) from None
        if not found:
            raise CommandError(f"logdir {logdir!r} does not exist (nothing is stored under it)")
        logdir = where.url
    else:
        if not os.path.exists(where.local_path):
            raise CommandError(f"logdir {logdir!r} does not exist")
        if not os.path.isdir(where.local_path):
            raise CommandError(f"logdir must be a directory; received {logdir!r}, which is a file")
        logdir = where.local_path
    from tensorboard import context
    from tensorboard.backend.event_processing import (
        data_provider,
        event_accumulator,
        plugin_event_multiplexer,
    )
    from tensorboard.plugins import base_plugin

    from tb_gradviz.board import plugin

    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        size_guidance={event_accumulator.TENSORS: 0}
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, logdir)
    gradviz = plugin.GradVizPlugin(base_plugin.TBContext(data_provider=provider, logdir=logdir))
    return gradviz, context.RequestContext(), ""


def _use_tensorboard_without_tensorflow():
    # TensorBoard's readers use the real TensorFlow when it is installed,
    # which costs seconds of import for nothing here; the presence of
    # `tensorboard.compat.notf` is its own switch to the built-in stub.
    if "tensorflow" not in sys.modules:
        import types

        sys.modules.setdefault(
            "tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf")
        )
    _check_records_in_c()


def _check_records_in_c():
    """Makes the stub's reader checksum each record with `google_crc32c` (C) instead of Python.

    Without TensorFlow, TensorBoard's event reader computes the CRC-32C of
    every record in pure Python, which is most of the time `check` and
    `export` take on a large logdir. `google_crc32c.value` computes the same
    checksum (the package's writer uses it too); the reader still refuses a
    record whose checksum does not match.
    """
    import google_crc32c
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

    if getattr(pywrap_tensorflow, "crc32c", None) is not None:
        pywrap_tensorflow.crc32c = google_crc32c.value


def runs_of(gradviz, ctx, experiment, logdir, only_run):
    runs = gradviz.runs_impl(ctx, experiment)["runs"]
    if not runs:
        raise CommandError(
            f"no tb_gradviz data in {logdir!r}: point it at the log_dir given to GradVizCallback "
            "(or a parent of it)",
            EXIT_NO_DATA,
        )
    if only_run is not None:
        names = [r["run"] for r in runs]
        runs = [r for r in runs if r["run"] == only_run]
        if not runs:
            raise CommandError(
                f"no run {only_run!r} with tb_gradviz data; runs are: {', '.join(names)}",
                EXIT_NO_DATA,
            )
    return runs
