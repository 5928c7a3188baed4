"""Plugin name, content version and the summary metadata of tb_gradviz data.

Imports neither TensorFlow nor Keras: the TensorBoard plugin depends on it.
The full format is described in docs/FORMAT.md.
"""

import json

from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.histogram import metadata as histogram_metadata

PLUGIN_NAME = "gradviz"

# Version of the JSON in `SummaryMetadata.plugin_data.content`. Content and
# record layouts change by addition only (a metadata key or a record field
# appended at the end; `records` lists every earlier layout, and readers
# fill what is missing), which keeps it at 1. Bump it only for a change a
# reader of the previous version would misread; `parse_plugin_metadata`
# keeps reading every older version and refuses newer ones.
PROTO_VERSION = 1

KIND_TENSOR = "tensor"
KIND_ROUTING = "routing"
KIND_UNITS = "units"
KIND_ROUTING_MAP = "routing_map"
KIND_UPDATE = "update"
# Per recorded tensor, what casts to narrow formats do (`records.PRECISION_FIELDS`).
KIND_PRECISION = "precision"
# The per-event digest (`digest`), the cost budget's record (`capture.budget`) and the
# loss scale's (`capture.loss_scale`), written under the digest's plugin name.
KIND_DIGEST = "digest"
KIND_BUDGET = "budget"
KIND_LOSS_SCALE = "loss_scale"
# Where each event's digest was computed: in the train step, or by the probe (`capture.in_step`).
KIND_DIGEST_SOURCE = "digest_source"
# A coarser level of the digest: one pooled digest per span of events (`digest_levels`).
KIND_DIGEST_LEVEL = "digest_level"
KINDS = (
    KIND_TENSOR,
    KIND_ROUTING,
    KIND_UNITS,
    KIND_ROUTING_MAP,
    KIND_UPDATE,
    KIND_PRECISION,
    KIND_DIGEST,
    KIND_BUDGET,
    KIND_LOSS_SCALE,
    KIND_DIGEST_SOURCE,
    KIND_DIGEST_LEVEL,
)


class NewerVersionError(ValueError):
    """Metadata written by a newer tb_gradviz than this reader."""


def create_summary_metadata(content, plugin_name=PLUGIN_NAME):
    """Returns a `SummaryMetadata` proto for a tb_gradviz record.

    Args:
      content: a JSON-serialisable dict; `version` is added.
      plugin_name: `PLUGIN_NAME`, or the digest's (`digest.PLUGIN_NAME`).

    Returns:
      A `summary_pb2.SummaryMetadata` with `DATA_CLASS_TENSOR`, without which
      TensorBoard's data providers drop the series silently.
    """
    payload = dict(content, version=PROTO_VERSION)
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=plugin_name,
            content=json.dumps(payload, sort_keys=True, separators=(",", ":")).encode(),
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def create_histogram_metadata(description=""):
    """Returns the metadata of TensorBoard's own histogram plugin (k x 3 data)."""
    metadata = histogram_metadata.create_summary_metadata(
        display_name=None, description=description
    )
    metadata.data_class = summary_pb2.DATA_CLASS_TENSOR
    return metadata


def parse_plugin_metadata(content):
    """Parses the plugin content of a tb_gradviz summary.

    Args:
      content: the `plugin_data.content` bytes (as `list_tensors` gives them).

    Returns:
      The content as a dict with at least `version` and `kind`.

    Raises:
      NewerVersionError: the content is of a newer version than this reader.
      ValueError: the content is not tb_gradviz metadata of a known version.
    """
    if not isinstance(content, (bytes, bytearray)):
        raise TypeError(f"content must be bytes; received {type(content).__name__}")
    try:
        parsed = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"tb_gradviz metadata is not UTF-8 JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise ValueError(
            f"tb_gradviz metadata must be a JSON object; received {type(parsed).__name__}"
        )
    version = parsed.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > PROTO_VERSION:
        raise NewerVersionError(
            f"tb_gradviz metadata version {version}; this reader knows 1..{PROTO_VERSION}"
        )
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(
            f"unknown tb_gradviz metadata version {version!r}; this reader knows 1..{PROTO_VERSION}"
        )
    if parsed.get("kind") not in KINDS:
        raise ValueError(
            f"unknown tb_gradviz record kind {parsed.get('kind')!r}; expected one of {KINDS}"
        )
    if not _valid_content(parsed):
        raise ValueError(
            f"tb_gradviz {parsed['kind']} metadata lacks a field or has one of the wrong type: "
            f"{str(parsed)[:200]}"
        )
    return parsed


def _is_str(value):
    return isinstance(value, str)


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_shape(value):
    return isinstance(value, list) and all(_is_int(n) or n is None for n in value)


def _valid_content(content):
    """Whether parsed metadata has the fields, of the types, readers rely on.

    Optional fields may be absent.
    """
    if content["kind"] in (KIND_BUDGET, KIND_LOSS_SCALE, KIND_DIGEST_SOURCE):
        fields = content.get("fields")
        return isinstance(fields, list) and all(map(_is_str, fields))
    if content["kind"] == KIND_DIGEST_LEVEL:
        level = content.get("level")
        if not (isinstance(level, dict) and _is_int(level.get("events"))):
            return False
        if not isinstance(content.get("part"), dict):
            return False
    if content["kind"] in (KIND_DIGEST, KIND_DIGEST_LEVEL):
        rows = content.get("rows")
        # A part of a digest series (layout 13, `digest_parts`); absent in a digest written whole.
        part = content.get("part", {"first_step": 0, "max_events": 1})
        return (
            isinstance(rows, list)
            and all(
                isinstance(row, list) and len(row) == 3 and all(map(_is_str, row)) for row in rows
            )
            and isinstance(part, dict)
            and _is_int(part.get("first_step"))
            and _is_int(part.get("max_events"))
        )
    common = (
        _is_str(content.get("layer"))
        and _is_int(content.get("layer_index"))
        and _is_str(content.get("layer_class", ""))
        and _is_str(content.get("layer_dtype", ""))
        and _is_str(content.get("backend", ""))
        and _is_str(content.get("device", ""))
        and isinstance(content.get("pooling"), (dict, type(None)))
    )
    if not common or content["kind"] == KIND_ROUTING:
        return common
    if content["kind"] == KIND_UNITS:
        return _is_str(content.get("tensor")) and _is_int(content.get("channel_axis"))
    if content["kind"] == KIND_UPDATE:
        return _is_str(content.get("tensor")) and _is_str(content.get("weight"))
    if content["kind"] == KIND_PRECISION:
        return (
            _is_str(content.get("tensor"))
            and _is_str(content.get("role"))
            and _is_int(content.get("index"))
            and _is_str(content.get("dtype", ""))
            and _is_str(content.get("weight", ""))
            and _is_str(content.get("compute_dtype", ""))
        )
    if content["kind"] == KIND_ROUTING_MAP:
        boxes = {
            "map": ("height", "width"),
            "crop": ("row", "col", "height", "width"),
            "windows": ("row", "col", "rows", "cols"),
        }
        return _is_int(content.get("example")) and all(
            isinstance(content.get(box), dict) and all(_is_int(content[box].get(k)) for k in keys)
            for box, keys in boxes.items()
        )
    return (
        _is_str(content.get("tensor"))
        and _is_str(content.get("role"))
        and _is_int(content.get("index"))
        and _is_str(content.get("histogram_tag"))
        and _is_shape(content.get("shape"))
        and _is_str(content.get("dtype", ""))
        and _is_str(content.get("weight", ""))
        and _is_str(content.get("compute_dtype", ""))
    )
