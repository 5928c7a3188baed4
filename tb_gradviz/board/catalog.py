"""What a run holds: its tb_gradviz series grouped by layer, from their metadata.

A series whose metadata this reader cannot read (newer, foreign, malformed)
is skipped, with a warning logged once per reason, as TensorBoard's own
plugins do (`_MetadataVersionChecker`); the rest of the run is served.
Imports neither TensorFlow nor Keras.
"""

import functools
import logging
import threading
from typing import NamedTuple

from tb_gradviz.format import digest, digest_parts, metadata, records

logger = logging.getLogger(__name__)


class Listed(NamedTuple):
    """One listed tb_gradviz series of a run."""

    tag: str
    # Its tb_gradviz metadata (`metadata.parse_plugin_metadata`).
    content: dict
    # Its `provider.TensorTimeSeries`, whose `(max_step, max_wall_time)` is its version.
    time_series: object


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


class TensorSeries(NamedTuple):
    """A tensor's listed series (`store.RunStore.tensor`)."""

    # Its tb_gradviz metadata.
    content: dict
    # The `provider.TensorTimeSeries` of its stats records.
    stats: object
    # That of its linear histograms (TensorBoard's `histograms` plugin), or None.
    histograms: object


class Digest(NamedTuple):
    """One digest series of a run (`store.RunStore.digests`): its parts, joined when read."""

    # Its metadata's `rows`: `[kind, layer, role or weight]` per row.
    rows: list
    # `((tag, provider.TensorTimeSeries), ...)` of its parts by first step: a digest written
    # whole (before layout 13) is one part, under the series' own tag, first.
    parts: tuple
    # The most events of all parts together (their `max_events`), or None when a part was
    # written whole.
    capacity: object
    # What its metadata says of its update rows' weights (`digest.update_weights`).
    update_weights: dict = {}


class Budget(NamedTuple):
    """A run's series of a record whose metadata names its fields: the cost budget's
    (`store.RunStore.budget`) or the loss scale's (`store.RunStore.loss_scale`)."""

    tag: str
    # The names of its record's values, in order.
    fields: list
    time_series: object


def layer_index(run, time_series_by_tag, skip_warning):
    """Groups one run's tb_gradviz series by layer.

    Returns:
      `{layer: {"info": content, "tensors": {tensor: Listed}, "routing":
      Listed or None, "units", "routing_map": likewise, "updates": {weight:
      Listed}, "precision": {tensor: Listed}}}`, without layers that have no
      tensor.
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
        listed = Listed(tag, content, time_series)
        if content["kind"] == metadata.KIND_ROUTING:
            layer["routing"] = listed
        elif content["kind"] == metadata.KIND_UNITS:
            layer["units"] = listed
        elif content["kind"] == metadata.KIND_ROUTING_MAP:
            layer["routing_map"] = listed
        elif content["kind"] == metadata.KIND_UPDATE:
            layer["updates"][content["weight"]] = listed
        elif content["kind"] == metadata.KIND_PRECISION:
            layer["precision"][content["tensor"]] = listed
        else:
            layer["tensors"][content["tensor"]] = listed
    return {name: layer for name, layer in layers.items() if layer["tensors"]}


# Each kind of a layer's records, in the order `store.RunStore.series_by_kind` reads them: its
# key in a layer of `layer_index`, and its layout.
KINDS = {
    "stats": ("tensors", records.STATS),
    "routing": ("routing", records.ROUTING),
    "units": ("units", records.UNITS),
    "updates": ("updates", records.UPDATE),
    "precision": ("precision", records.PRECISION),
}


def listed_by_kind(layers):
    """`{kind: {tag: time series}}` of every record of `layers` (of `layer_index`), by `KINDS`."""

    def entries(key):
        for layer in layers.values():
            found = layer[key]
            if isinstance(found, dict):
                yield from found.values()
            elif found is not None:
                yield found

    return {
        kind: {listed.tag: listed.time_series for listed in entries(key)}
        for kind, (key, _) in KINDS.items()
    }


def weight_updates(layer):
    """A layer's `updates` (of a `layer_index` entry) in the order of its weights.

    That order is their tensors' `index`.
    """
    contents = [listed.content for listed in layer["tensors"].values()]
    indexes = {
        content["weight"]: content["index"]
        for content in contents
        if content["role"] == records.WEIGHT
    }
    updates = layer["updates"]
    return {
        weight: updates[weight]
        for weight in sorted(updates, key=lambda w: (indexes.get(w, len(indexes)), w))
    }


def digest_series(run, time_series_by_tag, skip_warning):
    """Groups one run's digest series (plugin `gradviz_digest`) by their rows.

    The parts of a series (layout 13, `digest_parts`) are grouped under the
    tag of their rows (`digest_parts.series_tag`), with a digest of those
    rows written whole by an earlier writer. A digest with a row kind this
    reader does not know (`digest.ROW_KINDS`) is left out, with a warning
    logged once: the run is then read as one without a digest.

    Returns:
      `{series tag: Digest}`.
    """
    found = {}
    for tag in sorted(time_series_by_tag):
        time_series = time_series_by_tag[tag]
        content = parse_content(time_series, run, tag, skip_warning)
        if content is None or content["kind"] != metadata.KIND_DIGEST:
            continue
        # A newer writer's row kind has a length this reader cannot know.
        unknown = sorted({kind for kind, _, _ in content["rows"]} - set(digest.ROW_KINDS))
        if unknown:
            skip_warning("digest rows of an unknown kind", run, tag, f"row kinds {unknown}")
            continue
        first = digest_parts.first_step(content)
        rows, parts, weights = found.setdefault(
            digest_parts.series_tag(content), (content["rows"], [], digest.update_weights(content))
        )
        part = content.get("part", {})
        parts.append(((first is not None, first or 0, tag), tag, time_series, part))
    result = {}
    for series, (rows, parts, weights) in found.items():
        parts.sort(key=lambda entry: entry[0])
        bounds = [part.get("max_events") for *_, part in parts]
        capacity = None if None in bounds else sum(bounds)
        result[series] = Digest(
            rows, tuple((tag, ts) for _, tag, ts, _ in parts), capacity, weights
        )
    return result


def parse_content(time_series, run, tag, skip_warning):
    """Returns a series' tb_gradviz metadata as a dict, or None (warning once) if unreadable.

    Newer, foreign or malformed metadata under our plugin name skips that
    series only; the rest of the run is served. The dict is shared by every
    listing of the same metadata (a digest part's repeats every row, and each
    request lists the run again): callers read it, never change it.
    """
    try:
        return _parsed(time_series.plugin_content)
    except metadata.NewerVersionError as e:
        skip_warning("a newer metadata version (upgrade tb_gradviz to read them)", run, tag, e)
    except (ValueError, TypeError) as e:
        skip_warning("metadata tb_gradviz cannot read", run, tag, e)
    return None


@functools.lru_cache(maxsize=8192)
def _parsed(content):
    return metadata.parse_plugin_metadata(content)
