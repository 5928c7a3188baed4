"""Plugin name, content version and the summary metadata of tb_gradviz data.

Imports neither TensorFlow nor Keras: the TensorBoard plugin depends on it.
The full format is described in docs/FORMAT.md.
"""

import json

from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.histogram import metadata as histogram_metadata

PLUGIN_NAME = "gradviz"

# Version of the JSON in `SummaryMetadata.plugin_data.content`. Bump it when
# the content or a record layout changes; `parse_plugin_metadata` keeps
# reading every older version.
PROTO_VERSION = 1

KIND_TENSOR = "tensor"
KIND_ROUTING = "routing"
KINDS = (KIND_TENSOR, KIND_ROUTING)


def create_summary_metadata(content):
    """Returns a `SummaryMetadata` proto for a tb_gradviz record.

    Args:
      content: a JSON-serialisable dict; `version` is added.

    Returns:
      A `summary_pb2.SummaryMetadata` with `DATA_CLASS_TENSOR`, without which
      TensorBoard's data providers drop the series silently.
    """
    payload = dict(content, version=PROTO_VERSION)
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME,
            content=json.dumps(payload, sort_keys=True, separators=(",", ":")).encode(),
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def create_histogram_metadata(description=""):
    """Returns the metadata of TensorBoard's own histogram plugin (k x 3 data)."""
    metadata = histogram_metadata.create_summary_metadata(display_name=None, description=description)
    metadata.data_class = summary_pb2.DATA_CLASS_TENSOR
    return metadata


def parse_plugin_metadata(content):
    """Parses the plugin content of a tb_gradviz summary.

    Args:
      content: the `plugin_data.content` bytes (as `list_tensors` gives them).

    Returns:
      The content as a dict with at least `version` and `kind`.

    Raises:
      ValueError: the content is not tb_gradviz metadata of a known version.
    """
    if not isinstance(content, (bytes, bytearray)):
        raise TypeError(f"content must be bytes; received {type(content).__name__}")
    try:
        parsed = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"tb_gradviz metadata is not UTF-8 JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"tb_gradviz metadata must be a JSON object; received {type(parsed).__name__}")
    version = parsed.get("version")
    if not isinstance(version, int) or not 1 <= version <= PROTO_VERSION:
        raise ValueError(f"unknown tb_gradviz metadata version {version!r}; this reader knows 1..{PROTO_VERSION}")
    if parsed.get("kind") not in KINDS:
        raise ValueError(f"unknown tb_gradviz record kind {parsed.get('kind')!r}; expected one of {KINDS}")
    return parsed
