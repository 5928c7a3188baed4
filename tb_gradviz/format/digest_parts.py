"""The digest in parts: a run's digest series written as tags of a bounded size.

TensorBoard's Rust data server answers a `read_tensors` request in one gRPC
message, and TensorBoard refuses one over 256 MB: a digest series read whole
is refused past that size (about 7,500 events of all ResNet50 layers). So
the writer puts a series' events into parts (layout 13, docs/FORMAT.md): each
part is a tag of its own, `gradviz_digest/<12 hex of the rows>/<first step>`,
holding at most `max_events` events, chosen from the bytes of one event so
that a part holds at most `PART_BYTES`. Its metadata is the digest's (kind
`digest`, its `rows`, its `update_weights` when it has them) with
`"part": {"first_step", "max_events"}`. A reader joins the parts with the
same rows into one series in step order, reading each part in a request of
its own (`board/store.py`).

`Parts` assigns the parts on the writer's side; `series_tag` and
`first_step` tell a reader which series a listed digest tag belongs to and
where it begins. Numpy only.
"""

from typing import NamedTuple

from tb_gradviz.format import digest, metadata

# The most bytes of one part, far below the 256 MB of a gRPC message: eight parts fit one.
PART_BYTES = 32 << 20
# What one event adds to an answer besides its vector: its step, wall time, the tensor's dtype
# and shape, and their framing (an allowance, larger than what they take).
DATUM_BYTES = 64


def events_per_part(vector_bytes):
    """The most events of a part whose digests are `vector_bytes` bytes each (at least one)."""
    return max(1, PART_BYTES // (int(vector_bytes) + DATUM_BYTES))


def part_tag(series, first_step):
    """The tag of a part: its series' tag (`digest.digest_tag`) and its first step."""
    return f"{series}/{int(first_step)}"


class _Open(NamedTuple):
    """The part a series' events go into now."""

    tag: str
    summary_metadata: object
    max_events: int
    events: int


class Parts:
    """Puts each digest record into its series' current part: the one owner of that state.

    A part is filled with `max_events` events (`events_per_part` of the
    digest's bytes, read when the part begins), then the next event begins a
    new one named after its step. The writer holds one `Parts` for all its
    events, across files and repeated `fit` calls; a new writer begins new
    parts, so a run's parts are never over their bound by more than the
    events written at one part's first step again.
    """

    def __init__(self):
        self._open = {}  # series tag -> `_Open`
        self._rows = {}  # tag -> a digest series' metadata content, or None for another record

    def place(self, step, record):
        """Returns `record` (`(tag, array, summary_metadata)`) as written: a digest in its part,
        any other record as it is."""
        tag, vector, summary_metadata = record
        if summary_metadata is None or summary_metadata.plugin_data.plugin_name != (
            digest.PLUGIN_NAME
        ):
            return record
        described = self._rows.get(tag, False)
        if described is False:
            described = self._rows[tag] = _digest_content(summary_metadata.plugin_data.content)
        if described is None:
            return record
        current = self._open.get(tag)
        if current is None or current.events >= current.max_events:
            max_events = events_per_part(getattr(vector, "nbytes", 0))
            content = dict(described, part={"first_step": int(step), "max_events": max_events})
            summary = metadata.create_summary_metadata(content, plugin_name=digest.PLUGIN_NAME)
            current = _Open(part_tag(tag, step), summary, max_events, 0)
        self._open[tag] = current._replace(events=current.events + 1)
        return current.tag, vector, current.summary_metadata


def _digest_content(content):
    """What a part's metadata repeats of a digest's (its kind, its rows, what it says of its
    update rows' weights), or None for another record (budget, loss scale) or a digest already
    in a part."""
    try:
        parsed = metadata.parse_plugin_metadata(content)
    except ValueError:
        return None
    if parsed["kind"] != metadata.KIND_DIGEST or "part" in parsed:
        return None
    kept = ("kind", "rows", digest.UPDATE_WEIGHTS_KEY)
    return {key: parsed[key] for key in kept if key in parsed}


def series_tag(content):
    """The tag of the series a listed digest belongs to (its parsed metadata, kind `digest`):
    its rows' `digest.digest_tag`, which is the tag of a digest written whole (before layout
    13) and the prefix of its parts' tags."""
    return digest.digest_tag(content["rows"])


def first_step(content):
    """A digest's first step as its metadata says (a part's), or None for a digest written whole
    (before layout 13)."""
    part = content.get("part")
    return None if part is None else part["first_step"]
