"""The digest: one compact record per log event, derived from that event's full records.

A long run's full records (histograms, magnitude bins) are too many for
TensorBoard to hold whole, so a reader may be given a sample of them. The
digest holds what the gradient-flow view, the layer grid, the flags and the
time views need, for every chosen layer at every logged step, in a few tens
of bytes per tensor, under its own plugin name (`PLUGIN_NAME`) so that
TensorBoard keeps it whole while `gradviz` keeps a sample: the plugin's
loader (`board/loader.py`) sets `--samples_per_plugin` for it.

It is computed from the records themselves (`digest_records`), never from
the tensors, so it equals the full records wherever both exist, whatever the
backend or statistics path that made them. Numpy only; docs/FORMAT.md
describes the layout.

One record per event: a float32 vector, the concatenation of one segment
per row. The rows, in the order the records were written (model order),
are listed in the metadata as `[kind, layer, name]`:

* `tensor` rows (`name`: the tensor, as in its stats tag): `TENSOR_FIELDS`;
* `units` rows (`name`: the tensor whose channels are counted): `UNITS_FIELDS`;
* `update` rows (`name`: the weight), one per weight whose values are
  recorded (`weights=True`), NaN when the event has no update record for it
  (the first log event): `UPDATE_FIELDS`;
* `precision` rows (`name`: the tensor), one per precision record: its
  finite non-zero count and, for the formats a layer computes in
  (`PRECISION_FORMATS`), the as-is counts, then the values MXFP8 E4M3
  turns to zero (`BLOCK_FIELD`, the `block_underflow` flag's count; NaN
  for a record without the block part) (`PRECISION_FIELDS`). Digests
  written before them have none; digests written before the block count
  (layout 12) have rows without it (`EARLIER_FIELDS`), which
  `upgrade` reads with NaN there.

The tag is `gradviz_digest/<hash of the rows>`, so that a run directory
written by callbacks with other layers (other rows) gets another series
instead of misreading this one under the first metadata TensorBoard kept.
"""

import functools
import hashlib
import json
import math

import numpy as np

from tb_gradviz.format import metadata, precision, records

PLUGIN_NAME = "gradviz_digest"
TAG_PREFIX = PLUGIN_NAME

TENSOR = "tensor"
UNITS = "units"
UPDATE = "update"
PRECISION = "precision"
ROW_KINDS = (TENSOR, UNITS, UPDATE, PRECISION)

# Counts are float32: exact up to 2**24 elements, rounded to ~7 digits beyond.
TENSOR_FIELDS = (
    "count",  # all elements
    "zeros",  # exact zeros
    "nan",
    "pos_inf",
    "neg_inf",
    "rms",  # over the finite values: sqrt(mean**2 + std**2) of the stats record; NaN if none
    "max_abs",  # over the finite values: max(|min|, |max|) of the stats record; NaN if none
)
UNITS_FIELDS = records.UNITS_FIELDS  # channels, dead_channels
UPDATE_FIELDS = ("update_ratio", "interval")
# The formats a layer computes in (float16, bfloat16), as the values are (no scaling).
PRECISION_FORMATS = ("float16", "bfloat16")
# The block format whose zeros the `block_underflow` flag counts, and its count's field.
BLOCK_FORMAT = "mxfp8_e4m3"
BLOCK_FIELD = f"{BLOCK_FORMAT}_to_zero"
PRECISION_FIELDS = (
    "finite_nonzero",
    *(f"{name}_{count}" for name in PRECISION_FORMATS for count in precision.COUNTS),
    BLOCK_FIELD,
)
# Where each precision field is in the precision record.
_PRECISION_SOURCES = [
    records.PRECISION_FIELDS.index(
        "finite_nonzero"
        if field == "finite_nonzero"
        else f"block/{BLOCK_FORMAT}/to_zero"
        if field == BLOCK_FIELD
        else "as_is/" + field.replace("_", "/", 1)
    )
    for field in PRECISION_FIELDS
]
FIELDS = {
    TENSOR: TENSOR_FIELDS,
    UNITS: UNITS_FIELDS,
    UPDATE: UPDATE_FIELDS,
    PRECISION: PRECISION_FIELDS,
}
# The fields that count elements, by row kind (a reader checks them: whole and non-negative).
COUNT_FIELDS = {
    TENSOR: TENSOR_FIELDS[:5],
    UNITS: UNITS_FIELDS,
    UPDATE: (),
    PRECISION: PRECISION_FIELDS,
}
# Counts that may be NaN: unknown (a precision record without the block part), not malformed.
UNKNOWN_ALLOWED = (BLOCK_FIELD,)
# The fields of each row kind in digests written before layout 12.
EARLIER_FIELDS = dict(FIELDS, **{PRECISION: PRECISION_FIELDS[:-1]})
_LAYOUTS = {
    TENSOR: records.STATS,
    UNITS: records.UNITS,
    UPDATE: records.UPDATE,
    PRECISION: records.PRECISION,
}


def digest_tag(rows):
    """Returns the tag of a digest with these rows: `gradviz_digest/<12 hex digits>`."""
    text = json.dumps(rows, separators=(",", ":"))
    return f"{TAG_PREFIX}/{hashlib.sha1(text.encode()).hexdigest()[:12]}"


@functools.lru_cache(maxsize=4096)
def _row_of(content):
    """The row a `gradviz` record's metadata makes: `(kind, layer, name, weight, role)`, or None."""
    try:
        parsed = metadata.parse_plugin_metadata(content)
    except ValueError:
        return None
    kind = parsed["kind"]
    if kind == metadata.KIND_TENSOR:
        return (TENSOR, parsed["layer"], parsed["tensor"], parsed.get("weight"), parsed["role"])
    if kind == metadata.KIND_UNITS:
        return (UNITS, parsed["layer"], parsed["tensor"], None, None)
    if kind == metadata.KIND_UPDATE:
        return (UPDATE, parsed["layer"], parsed["weight"], None, None)
    if kind == metadata.KIND_PRECISION:
        return (PRECISION, parsed["layer"], parsed["tensor"], None, None)
    return None


def tensor_segments(stats):
    """The tensor rows' values (`TENSOR_FIELDS`) of `[n, STATS_LENGTH]` stats vectors: `[n, 7]`."""
    stats = np.asarray(stats, dtype=np.float64).reshape(-1, records.STATS_LENGTH)
    counts = stats[:, : records.STAT_NEG_INF + 1]
    finite = counts[:, records.STAT_COUNT] - counts[:, records.STAT_NAN :].sum(axis=1)
    mean, std = stats[:, records.STAT_MEAN], stats[:, records.STAT_STD]
    extremes = np.abs(stats[:, [records.STAT_MIN, records.STAT_MAX]])
    with np.errstate(invalid="ignore"):
        rms = np.where(finite > 0, np.sqrt(mean * mean + std * std), np.nan)
        max_abs = np.where(finite > 0, extremes.max(axis=1), np.nan)
    return np.column_stack([counts, rms, max_abs])


def digest_records(event_records):
    """Returns the digest of one log event's records: `[(tag, float32 vector, metadata)]`.

    Args:
      event_records: the event's `(tag, array, summary_metadata)` records;
        records of other kinds (histograms, routing, ...) are passed over.

    Returns:
      One record, or none when the event holds no tensor record.
    """
    rows = []
    stats, units, precisions = [], [], []  # the arrays of the tensor, units, precision rows
    updates = {}
    weights = []  # (layer, weight) of each recorded weight value, in order
    for _, array, summary_metadata in event_records:
        if summary_metadata is None:
            continue
        plugin_data = summary_metadata.plugin_data
        if plugin_data.plugin_name != metadata.PLUGIN_NAME:
            continue
        row = _row_of(plugin_data.content)
        if row is None:
            continue
        kind, layer, name, weight, role = row
        # A record of no known layout makes no row (readers skip it too).
        layout = _LAYOUTS[kind]
        if getattr(array, "shape", None) != layout.shape:
            array = layout.upgrade(np.asarray(array, dtype=np.float64).ravel())
            if array is None:
                continue
        if kind == UPDATE:
            updates[(layer, name)] = array
            continue
        rows.append((kind, layer, name))
        if kind == TENSOR:
            stats.append(array)
            if role == records.WEIGHT and weight is not None:
                weights.append((layer, weight))
        elif kind == PRECISION:
            precisions.append(np.asarray(array, dtype=np.float64)[_PRECISION_SOURCES])
        else:
            units.append(array[: len(UNITS_FIELDS)])
    if not rows:
        return []
    update_values = []
    for layer, weight in weights:
        rows.append((UPDATE, layer, weight))
        update = updates.get((layer, weight))
        update_values.append(
            (math.nan, math.nan)
            if update is None
            else (update[records.UPDATE_RATIO], update[records.UPDATE_INTERVAL])
        )
    blocks = {
        TENSOR: iter(tensor_segments(np.stack(stats)) if stats else ()),
        UNITS: iter(units),
        UPDATE: iter(update_values),
        PRECISION: iter(precisions),
    }
    vector = np.concatenate(
        [np.asarray(next(blocks[kind]), dtype=np.float64) for kind, _, _ in rows]
    ).astype(np.float32)
    tag, summary_metadata = _series_of(tuple(rows))
    return [(tag, vector, summary_metadata)]


def digest_series(rows, update_weights=None):
    """The tag and metadata of a digest with these `(kind, layer, name)` rows.

    Args:
      rows: the rows.
      update_weights: None, or one `(layer_index, layer_class, count)` per
        `update` row, in their order: what a reader knows of a weight whose
        layer has no other row (`UPDATE_WEIGHTS_KEY`).
    """
    described = None
    if update_weights is not None:
        described = tuple((int(i), str(c), int(n)) for i, c, n in update_weights)
    return _series_of(tuple(tuple(row) for row in rows), described)


# The digest metadata's optional list, one entry per `update` row in order, of what the
# layer and the weight are: `{"layer_index", "layer_class", "count"}` (the in-step digest's
# update rows name layers the full records may not hold, and a weight's size decides whether
# the update rules judge it).
UPDATE_WEIGHTS_KEY = "update_weights"


@functools.lru_cache(maxsize=64)
def _series_of(rows, update_weights=None):
    """The tag and metadata of a digest with these rows (the same at every event of a fit)."""
    rows = [list(row) for row in rows]
    content = {"kind": metadata.KIND_DIGEST, "rows": rows}
    if update_weights is not None:
        content[UPDATE_WEIGHTS_KEY] = [
            {"layer_index": i, "layer_class": c, "count": n} for i, c, n in update_weights
        ]
    return digest_tag(rows), metadata.create_summary_metadata(content, plugin_name=PLUGIN_NAME)


def update_weights(content):
    """`{(layer, weight): {"layer_index", "layer_class", "count"}}` of a parsed digest
    metadata's `update` rows (`UPDATE_WEIGHTS_KEY`); empty when it has none, or not one well
    formed entry per update row."""
    listed = content.get(UPDATE_WEIGHTS_KEY)
    updates = [(layer, name) for kind, layer, name in content.get("rows", ()) if kind == UPDATE]
    if not isinstance(listed, list) or len(listed) != len(updates):
        return {}
    found = {}
    for row, entry in zip(updates, listed):
        if not (
            isinstance(entry, dict)
            and _whole(entry.get("layer_index"))
            and _whole(entry.get("count"))
            and isinstance(entry.get("layer_class", ""), str)
        ):
            return {}
        found[tuple(row)] = entry
    return found


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def marked_in_step(fields, values):
    """`[events]` bool: where a digest-source record (`gradviz_digest/source`: vectors of
    `fields`, `[events, fields]`) says the train step computed the event's digest."""
    values = np.asarray(values, np.float64).reshape(-1, len(fields))
    if "in_step" not in fields:
        return np.zeros(len(values), bool)
    return values[:, list(fields).index("in_step")] == 1


def row_offsets(rows, fields=FIELDS):
    """Returns where each row's segment begins in the vector, and the vector's length, with
    `fields` per row kind (today's, or `EARLIER_FIELDS`)."""
    offsets, offset = [], 0
    for kind, _, _ in rows:
        offsets.append(offset)
        offset += len(fields[kind])
    return offsets, offset


@functools.lru_cache(maxsize=64)
def _earlier_sources(rows):
    """`(length, targets)`: an earlier digest's length with these rows, and where each of its
    values goes in today's vector; None when both layouts have the same length."""
    offsets, length = row_offsets(rows)
    _, earlier = row_offsets(rows, EARLIER_FIELDS)
    if earlier == length:
        return None
    targets = [
        offset + FIELDS[kind].index(field)
        for (kind, _, _), offset in zip(rows, offsets)
        for field in EARLIER_FIELDS[kind]
    ]
    return earlier, np.array(targets, np.int64)


def upgrade(rows, vectors):
    """`[n, length]` digests with these rows in today's layout, or None when their length is
    neither today's nor an earlier layout's. An earlier digest's precision rows get NaN for the
    fields added since (`EARLIER_FIELDS`)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    _, length = row_offsets(rows)
    if vectors.shape[-1] == length:
        return vectors
    earlier = _earlier_sources(tuple(tuple(row) for row in rows))
    if earlier is None or vectors.shape[-1] != earlier[0]:
        return None
    upgraded = np.full(vectors.shape[:-1] + (length,), np.nan)
    upgraded[..., earlier[1]] = vectors
    return upgraded


class DigestLayout(records.Layout):
    """The `records.Layout` of a digest with these rows: today's length, earlier digests
    upgraded (`upgrade`), and its counts checked (`COUNT_FIELDS`; NaN where unknown is allowed,
    `UNKNOWN_ALLOWED`)."""

    def __init__(self, rows):
        offsets, length = row_offsets(rows)
        counted = [
            (offset + FIELDS[kind].index(field), field in UNKNOWN_ALLOWED)
            for (kind, _, _), offset in zip(rows, offsets)
            for field in COUNT_FIELDS[kind]
        ]
        columns = [i for i, _ in counted]
        unknown_allowed = np.flatnonzero([allowed for _, allowed in counted])

        def counts(values):
            found = values[:, columns]  # a copy: NaN where unknown is allowed becomes 0 in it
            allowed = found[:, unknown_allowed]
            allowed[np.isnan(allowed)] = 0.0
            found[:, unknown_allowed] = allowed
            return found

        super().__init__("digest", (length,), counts)
        self._rows = rows

    def upgrade(self, array):
        # Called for every point of a series: today's length is told without the rows.
        array = np.asarray(array, dtype=np.float64)
        if array.shape == self.shape:
            return array
        return upgrade(self._rows, array) if array.ndim == 1 else None


def decode_digest(rows, vectors):
    """Decodes `[n, length]` digests with these rows, column-wise.

    Args:
      rows: the rows of the digest's metadata.
      vectors: the digests of `n` events (each a vector of the rows' length).

    Returns:
      `{(kind, layer, name): {field: [n] float64 array}}`.

    Raises:
      ValueError: a vector has neither the rows' length nor an earlier layout's.
    """
    offsets, length = row_offsets(rows)
    vectors = np.asarray(vectors, dtype=np.float64)
    if vectors.ndim == 1:
        vectors = vectors[None]
    upgraded = upgrade(rows, vectors)
    if upgraded is None:
        raise ValueError(
            f"a digest of {len(rows)} rows has {length} values; received {vectors.shape[-1]}"
        )
    vectors = upgraded
    result = {}
    for (kind, layer, name), offset in zip(rows, offsets):
        result[(kind, layer, name)] = {
            field: vectors[:, offset + i] for i, field in enumerate(FIELDS[kind])
        }
    return result
