"""What a run holds: its tb_gradviz series grouped by layer, from their metadata.

A series whose metadata this reader cannot read (newer, foreign, malformed)
is skipped, with a warning logged once per reason, as TensorBoard's own
plugins do (`_MetadataVersionChecker`); the rest of the run is served.
Imports neither TensorFlow nor Keras.
"""

import logging
import threading

from tb_gradviz.format import metadata, records

logger = logging.getLogger(__name__)


class SkipWarning:
    """Logs, once per reason, that series were skipped.

    As TensorBoard's `_MetadataVersionChecker` does.
    """

    def __init__(self):
        self._warned = set()
        self._lock = threading.Lock()

    def __call__(self, reason, run, tag, detail):
        with self._lock:
            if reason in self._warned:
                return
            self._warned.add(reason)
        logger.warning(
            "tb_gradviz skips series with %s (sample: run %r, tag %r): %s", reason, run, tag, detail
        )


def layer_index(run, time_series_by_tag, skip_warning):
    """Groups one run's tb_gradviz series by layer.

    Returns:
      `{layer: {"info": content, "tensors": {tensor: (tag, content, series)},
      "routing": (tag, content, series) or None, "units", "routing_map":
      likewise, "updates": {weight: (tag, content, series)}, "precision":
      {tensor: (tag, content, series)}}}`,
      without layers that have no tensor.
    """
    layers = {}
    # Sorted tags: loaders list them in different orders, and the first
    # metadata seen for a layer must not depend on that.
    for tag in sorted(time_series_by_tag):
        time_series = time_series_by_tag[tag]
        content = parse_content(time_series, run, tag, skip_warning)
        if content is None:
            continue
        layer = layers.setdefault(
            content["layer"],
            {
                "info": content,
                "tensors": {},
                "routing": None,
                "units": None,
                "routing_map": None,
                "updates": {},
                "precision": {},
            },
        )
        if content["kind"] == metadata.KIND_ROUTING:
            layer["routing"] = (tag, content, time_series)
        elif content["kind"] == metadata.KIND_UNITS:
            layer["units"] = (tag, content, time_series)
        elif content["kind"] == metadata.KIND_ROUTING_MAP:
            layer["routing_map"] = (tag, content, time_series)
        elif content["kind"] == metadata.KIND_UPDATE:
            layer["updates"][content["weight"]] = (tag, content, time_series)
        elif content["kind"] == metadata.KIND_PRECISION:
            layer["precision"][content["tensor"]] = (tag, content, time_series)
        else:
            layer["tensors"][content["tensor"]] = (tag, content, time_series)
    return {name: layer for name, layer in layers.items() if layer["tensors"]}


def weight_updates(layer):
    """A layer's `updates` (of a `layer_index` entry) in the order of its weights.

    That order is their tensors' `index`.
    """
    indexes = {
        content["weight"]: content["index"]
        for _, content, _ in layer["tensors"].values()
        if content["role"] == records.WEIGHT
    }
    updates = layer["updates"]
    return {
        weight: updates[weight]
        for weight in sorted(updates, key=lambda w: (indexes.get(w, len(indexes)), w))
    }


def parse_content(time_series, run, tag, skip_warning):
    """Returns a series' tb_gradviz metadata as a dict, or None (warning once) if unreadable.

    Newer, foreign or malformed metadata under our plugin name skips that
    series only; the rest of the run is served.
    """
    try:
        return metadata.parse_plugin_metadata(time_series.plugin_content)
    except metadata.NewerVersionError as e:
        skip_warning("a newer metadata version (upgrade tb_gradviz to read them)", run, tag, e)
    except (ValueError, TypeError) as e:
        skip_warning("metadata tb_gradviz cannot read", run, tag, e)
    return None
