"""The records of tb_gradviz: tags, layouts with named fields, their numpy definition and decoders.

The one owner of what a record holds: the writer (`events`), the capture
backends, `kernels`, the plugin, the CLI, the benchmarks and the tests use
the names here, never positions. Imports only numpy. docs/FORMAT.md
describes the same layouts for readers in other languages.

Per layer and tensor, one log event writes:

* `gradviz/<layer>/<tensor>`: TensorBoard histogram plugin data, `[k, 3]`
  float64 rows `[left, right, count]` over the finite values (k = 30), so the
  Histograms dashboard and tools such as tbparse read it;
* `gradviz/<layer>/<tensor>/stats`: a float64 vector, `STATS_FIELDS` then the
  symmetric-log bins of the non-zero finite values (`LOG_EDGES`);

and, per pooling layer, `gradviz/<layer>/routing`: a float64 vector of
`ROUTING_FIELDS`.

Layouts change by addition only: a field is appended at the end of a
record, never moved, renamed or given another meaning, so a reader pads an
older, shorter record with NaN (`*_LAYOUTS` list every length ever written)
and the metadata version stays 1. tests/test_layouts.py reads event files
written by every earlier layout.
"""

import numpy as np

from tb_gradviz.format import blocks, metadata, precision
from tb_gradviz.format.layout import Layout
from tb_gradviz.format.layout import upgraded as _upgraded

TAG_PREFIX = "gradviz"
HISTOGRAM_BUCKETS = 30

STATS_FIELDS = (
    "count",  # all elements
    "zeros",  # exact zeros (+0.0 and -0.0)
    "nan",
    "pos_inf",
    "neg_inf",
    "min",  # min, max, mean, std and sum are over the finite values;
    "max",  # NaN when there is none
    "mean",
    "std",  # population standard deviation
    "sum",
)

# Magnitude bins of the non-zero finite values: half decades from 1e-12 to 1e6.
# Bin j holds |x| in [LOG_EDGES[j-1], LOG_EDGES[j]); bin 0 is |x| < 1e-12
# (underflow, still non-zero) and the last bin is |x| >= 1e6.
LOG_MIN_EXPONENT = -12
LOG_MAX_EXPONENT = 6
LOG_BINS_PER_DECADE = 2
LOG_EDGES = 10.0 ** (
    np.arange(LOG_MIN_EXPONENT * LOG_BINS_PER_DECADE, LOG_MAX_EXPONENT * LOG_BINS_PER_DECADE + 1)
    / LOG_BINS_PER_DECADE
)
MAGNITUDE_BINS = len(LOG_EDGES) + 1
# The vector holds the negative values' magnitude bins, then the positive ones'.
STATS_LENGTH = len(STATS_FIELDS) + 2 * MAGNITUDE_BINS

ROUTING_FIELDS = (
    "input_positions",  # elements of the layer input
    "routed_positions",  # input elements that receive gradient from >= 1 window
    "windows",  # elements of the layer output (one pooling window each)
    "tied_windows",  # max pooling: windows whose maximum occurs more than once (NaN otherwise)
    "input_gradient_sum",
    "output_gradient_sum",
    "output_gradient_abs_sum",  # the scale against which the two sums are compared
)

# Named positions, for code that indexes a vector (numba compiles module ints
# as constants). The stats fields that count elements, and the two bin lists:
(
    STAT_COUNT,
    STAT_ZEROS,
    STAT_NAN,
    STAT_POS_INF,
    STAT_NEG_INF,
    STAT_MIN,
    STAT_MAX,
    STAT_MEAN,
    STAT_STD,
    STAT_SUM,
) = range(len(STATS_FIELDS))
STATS_COUNT_FIELDS = STATS_FIELDS[: STAT_NEG_INF + 1]
# The fields that depend on the order of float additions (fast paths agree
# with the numpy definition to rounding there); every other field is exact.
SUMMED_STATS = slice(STAT_MEAN, STAT_SUM + 1)
NEGATIVE_BINS = slice(len(STATS_FIELDS), len(STATS_FIELDS) + MAGNITUDE_BINS)
_FIRST_BIN = NEGATIVE_BINS.start
POSITIVE_BINS = slice(len(STATS_FIELDS) + MAGNITUDE_BINS, STATS_LENGTH)
(
    ROUTING_INPUT_POSITIONS,
    ROUTING_ROUTED_POSITIONS,
    ROUTING_WINDOWS,
    ROUTING_TIED_WINDOWS,
    ROUTING_INPUT_GRADIENT_SUM,
    ROUTING_OUTPUT_GRADIENT_SUM,
    ROUTING_OUTPUT_GRADIENT_ABS_SUM,
) = range(len(ROUTING_FIELDS))
# `tied_windows` is NaN for average pools; the other three always count.
ROUTING_COUNT_FIELDS = ROUTING_FIELDS[: ROUTING_TIED_WINDOWS + 1]
ROUTING_SUMS = slice(ROUTING_INPUT_GRADIENT_SUM, None)

# Per layer, `gradviz/<layer>/units`: its (first) activation's channels, how
# many are dead (exactly zero for every probe example and position), then
# the first `UNITS_LISTED` dead channel indices, NaN-padded.
UNITS_FIELDS = ("channels", "dead_channels")
UNITS_LISTED = 32
UNITS_LENGTH = len(UNITS_FIELDS) + UNITS_LISTED

ACTIVATION = "activation"
INPUT_GRADIENT = "input_gradient"
OUTPUT_GRADIENT = "output_gradient"
TENSOR_ROLES = (ACTIVATION, INPUT_GRADIENT, OUTPUT_GRADIENT)  # what every chosen layer records
# With `weights=True`, per trainable weight of a layer (kernel, bias, gamma,
# beta): its values, and the gradient of the probe loss w.r.t. it.
WEIGHT = "weight"
WEIGHT_GRADIENT = "weight_gradient"
WEIGHT_ROLES = (WEIGHT, WEIGHT_GRADIENT)
ROLES = (*TENSOR_ROLES, *WEIGHT_ROLES)
# The roles whose values are gradients of the (possibly loss-scaled) probe loss.
GRADIENT_ROLES = (INPUT_GRADIENT, OUTPUT_GRADIENT, WEIGHT_GRADIENT)

# Per trainable weight, from the second log event on, `gradviz/<layer>/update/<weight>`:
# how far the weight moved since the previous log event.
UPDATE_FIELDS = (
    "weight_norm",  # |w|, the Euclidean norm of the weight now
    "update_norm",  # |w - w_previous|, w_previous being the weight at the previous log event
    "update_ratio",  # update_norm / weight_norm (NaN when both are 0, inf when only the weight is)
    "interval",  # optimizer steps between the two log events
)
UPDATE_WEIGHT_NORM, UPDATE_NORM, UPDATE_RATIO, UPDATE_INTERVAL = range(len(UPDATE_FIELDS))


# Per recorded tensor, `gradviz/<layer>/<tensor>/precision`: what a cast of
# its values as captured (gradients at the run's loss scale) to each of
# `precision.FORMATS` does, as the values are and scaled by the power of two
# `2**scale_exponent` that brings its largest finite magnitude closest to the
# format's largest value (see format/precision.py for the rounding). Counts
# are over the finite values; NaN and Inf are counted in the stats record.
# Then (layout 12) the block part, `blocks.RECORD_FIELDS`: what the
# block-scaled formats of `blocks.FORMATS` do to the same values.
PRECISION_FIELDS = (
    "finite_nonzero",  # finite, non-zero values: what the shares are of
    *(f"scale_exponent/{name}" for name in precision.FORMATS),
    *(
        f"{setting}/{name}/{count}"  # non-zero values that become 0; subnormal results; overflows
        for setting in precision.SETTINGS
        for name in precision.FORMATS
        for count in precision.COUNTS
    ),
    *blocks.RECORD_FIELDS,
)
PRECISION_LENGTH = len(PRECISION_FIELDS)
# The fields before the block part: what casts to `precision.FORMATS` do.
PRECISION_CAST_LENGTH = PRECISION_LENGTH - len(blocks.RECORD_FIELDS)


def tensor_name(role, index, count):
    """Returns the tensor's name in tags: the role, with `_<index>` when a layer has several."""
    return role if count == 1 else f"{role}_{index}"


def weight_tensor_name(role, weight):
    """Returns a weight tensor's name in tags: `weight/<weight>` or `weight_gradient/<weight>`."""
    return f"{role}/{weight}"


def histogram_tag(layer, tensor):
    return f"{TAG_PREFIX}/{layer}/{tensor}"


def stats_tag(layer, tensor):
    return f"{TAG_PREFIX}/{layer}/{tensor}/stats"


def routing_tag(layer):
    return f"{TAG_PREFIX}/{layer}/routing"


def units_tag(layer):
    return f"{TAG_PREFIX}/{layer}/units"


def routing_map_tag(layer):
    return f"{TAG_PREFIX}/{layer}/routing_map"


def precision_tag(layer, tensor):
    return f"{TAG_PREFIX}/{layer}/{tensor}/precision"


def update_tag(layer, weight):
    return f"{TAG_PREFIX}/{layer}/update/{weight}"


def stats_has_nonfinite(values):
    """Whether a stats record counts a NaN or an Inf.

    The caller knows the record is a stats record from its metadata (kind
    `tensor`), not from its tag: a weight named `stats` has a histogram tag
    ending in `/stats` too.
    """
    counts = decode_stats(values)
    return any(counts[name] > 0 for name in ("nan", "pos_inf", "neg_inf"))


def nonfinite_stats_tags(event_records):
    """The tags of an event's stats records (kind `tensor` by their metadata) that count a NaN
    or an Inf, from its `(tag, array, summary_metadata)` records."""
    found = []
    for tag, values, summary_metadata in event_records:
        plugin_data = summary_metadata.plugin_data
        if plugin_data.plugin_name != metadata.PLUGIN_NAME:
            continue
        if metadata.parse_plugin_metadata(plugin_data.content)["kind"] != metadata.KIND_TENSOR:
            continue
        if stats_has_nonfinite(values):
            found.append(tag)
    return found


HISTOGRAM = Layout("histogram", (HISTOGRAM_BUCKETS, 3), lambda values: values[:, :, 2])
STATS = Layout(
    "stats",
    (STATS_LENGTH,),
    lambda values: np.concatenate([values[:, : STAT_NEG_INF + 1], values[:, _FIRST_BIN:]], axis=1),
)
# Routing records before `output_gradient_abs_sum` (tb_gradviz's first
# commit) hold six fields.
ROUTING = Layout(
    "routing",
    (len(ROUTING_FIELDS),),
    lambda values: values[:, : ROUTING_WINDOWS + 1],
    earlier_lengths=(6,),
)


UNITS = Layout("units", (UNITS_LENGTH,), lambda values: values[:, : len(UNITS_FIELDS)])


def units_vector(dead):
    """Returns the units record of a boolean vector, one entry per channel: is it dead?"""
    dead = np.asarray(dead, dtype=bool).ravel()
    listed = np.flatnonzero(dead)[:UNITS_LISTED]
    vector = np.full(UNITS_LENGTH, np.nan)
    vector[: len(UNITS_FIELDS)] = [dead.size, np.count_nonzero(dead)]
    vector[len(UNITS_FIELDS) : len(UNITS_FIELDS) + listed.size] = listed
    return vector


def decode_units(vector):
    """Returns a units record as `{"channels", "dead_channels", "listed"}` (ints)."""
    vector = _upgraded(UNITS, vector)
    counts, listed = vector[: len(UNITS_FIELDS)], vector[len(UNITS_FIELDS) :]
    return {
        **{name: int(value) for name, value in zip(UNITS_FIELDS, counts)},
        "listed": listed[np.isfinite(listed)].astype(np.int64).tolist(),
    }


UPDATE = Layout("update", (len(UPDATE_FIELDS),), lambda values: values[:, UPDATE_INTERVAL])

_PRECISION_COUNTS = [0, *range(1 + len(precision.FORMATS), PRECISION_CAST_LENGTH)]
_BLOCK_COUNTS = [PRECISION_FIELDS.index(field) for field in blocks.RECORD_COUNT_FIELDS]


def _precision_counts(values):
    """The counts of `[n, PRECISION_LENGTH]` records; a block part all NaN (written before it,
    or turned off) counts as absent, not malformed."""
    block = values[:, _BLOCK_COUNTS]
    absent = np.isnan(block).all(axis=1, keepdims=True)
    return np.concatenate([values[:, _PRECISION_COUNTS], np.where(absent, 0.0, block)], axis=1)


# Precision records before the block part (layouts 8 to 11) hold 29 fields.
PRECISION = Layout(
    "precision",
    (PRECISION_LENGTH,),
    _precision_counts,
    earlier_lengths=(PRECISION_CAST_LENGTH,),
)


def decode_precision(vector):
    """Returns one precision record as `{"finite_nonzero", "formats": {format: {"scale_exponent",
    "as_is": {count: int}, "scaled": {count: int}}}, "block_formats"}`; `block_formats` is
    `blocks.decode_fields`' (None for a record without the block part).

    Raises:
      ValueError: the vector does not have the record's length.
    """
    vector = _upgraded(PRECISION, vector)
    fields = dict(zip(PRECISION_FIELDS, vector))
    return {
        "finite_nonzero": int(fields["finite_nonzero"]),
        "formats": {
            name: {
                "scale_exponent": int(fields[f"scale_exponent/{name}"]),
                **{
                    setting: {
                        count: int(fields[f"{setting}/{name}/{count}"])
                        for count in precision.COUNTS
                    }
                    for setting in precision.SETTINGS
                },
            }
            for name in precision.FORMATS
        },
        "block_formats": blocks.decode_fields(fields),
    }


def update_columns(values):
    """Decodes `[n, len(UPDATE_FIELDS)]` update records by column: `{field: [n] float64 array}`."""
    values = np.asarray(values, dtype=np.float64).reshape(-1, len(UPDATE_FIELDS))
    return {name: values[:, i] for i, name in enumerate(UPDATE_FIELDS)}


class _RoutingMapLayout:
    """Routing maps: `[channels, values]` float32, `values` fixed per series by its metadata."""

    name = "routing map"
    shape = (None, None)

    @staticmethod
    def upgrade(array):
        array = np.asarray(array, dtype=np.float32)
        return array if array.ndim == 2 else None

    @staticmethod
    def valid_rows(values):
        return np.ones(len(values), bool)


ROUTING_MAP = _RoutingMapLayout()


def decode_stats(vector):
    """Returns one stats record as a dict; `log_counts` holds the two bin lists.

    Raises:
      ValueError: the vector does not have the record's length.
    """
    vector = _upgraded(STATS, vector)
    result = {name: float(value) for name, value in zip(STATS_FIELDS, vector)}
    result["log_counts"] = {
        "negative": vector[NEGATIVE_BINS].astype(np.int64).tolist(),
        "positive": vector[POSITIVE_BINS].astype(np.int64).tolist(),
    }
    return result


def decode_routing(vector):
    """Returns one routing record as a dict of `ROUTING_FIELDS` (NaN for fields its layout lacked).

    Raises:
      ValueError: the vector has no routing layout's length.
    """
    return {name: float(value) for name, value in zip(ROUTING_FIELDS, _upgraded(ROUTING, vector))}


def stats_columns(values):
    """Decodes `[n, STATS_LENGTH]` stats records column-wise.

    Returns:
      `{field: [n] array}` for `STATS_FIELDS` (the count fields as int64),
      and `"negative"`, `"positive"`: the `[n, MAGNITUDE_BINS]` int64 bins.
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1, STATS_LENGTH)
    columns = {
        name: values[:, i].astype(np.int64) if name in STATS_COUNT_FIELDS else values[:, i]
        for i, name in enumerate(STATS_FIELDS)
    }
    columns["negative"] = values[:, NEGATIVE_BINS].astype(np.int64)
    columns["positive"] = values[:, POSITIVE_BINS].astype(np.int64)
    return columns


def routing_columns(values):
    """Decodes `[n, len(ROUTING_FIELDS)]` routing records column-wise: `{field: [n] float64 array}`.

    Counts stay float: `tied_windows` is NaN for average pools, and fields
    added after a record was written are NaN.
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1, len(ROUTING_FIELDS))
    return {name: values[:, i] for i, name in enumerate(ROUTING_FIELDS)}


def log_edges_description():
    """The magnitude bins as they are written into metadata."""
    return {
        "min_exponent": LOG_MIN_EXPONENT,
        "max_exponent": LOG_MAX_EXPONENT,
        "per_decade": LOG_BINS_PER_DECADE,
    }
