"""Reads event files back for tests, through TensorBoard's own event reader."""

import math

import numpy as np
import pytest
from tensorboard.backend.event_processing import (
    data_provider,
    event_accumulator,
    plugin_event_multiplexer,
)
from tensorboard.plugins import base_plugin
from tensorboard.util import tensor_util

from tb_gradviz.board import plugin
from tb_gradviz.format import digest, metadata, records, summaries

# Every point of every plugin kept by the Python loader.
WHOLE = {"gradviz": 0, "histograms": 0, "gradviz_digest": 0}


class ReadingProvider(data_provider.MultiplexerDataProvider):
    """TensorBoard's own data provider, which calls `on_read(plugin name, sorted tags)` before
    each `read_tensors`: tests count, inspect or slow the plugin's reads there. By default it
    keeps them in `reads`."""

    def __init__(self, *args):
        super().__init__(*args)
        self.reads = []

    def on_read(self, plugin_name, tags):
        self.reads.append((plugin_name, tags))

    def read_tensors(self, ctx, *, experiment_id, plugin_name, downsample, run_tag_filter):
        self.on_read(plugin_name, sorted(run_tag_filter.tags))
        return super().read_tensors(
            ctx,
            experiment_id=experiment_id,
            plugin_name=plugin_name,
            downsample=downsample,
            run_tag_filter=run_tag_filter,
        )


def plugin_over(logdir, provider_class=ReadingProvider):
    """`(GradVizPlugin, provider)` over `logdir`, read by the Python loader with every point."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance=WHOLE)
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = provider_class(multiplexer, str(logdir))
    context_ = base_plugin.TBContext(logdir=str(logdir), data_provider=provider)
    return plugin.GradVizPlugin(context_), provider


def load(logdir):
    """Returns an EventAccumulator over `logdir` holding every tensor event."""
    accumulator = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    return accumulator


def tensor_tags(accumulator):
    return sorted(accumulator.Tags()[event_accumulator.TENSORS])


def values(accumulator, tag):
    """Returns `[(step, ndarray)]` of a tag."""
    return [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in accumulator.Tensors(tag)]


def last_step(run_dir):
    """The last step of any tensor series of the run written in `run_dir`."""
    log = load(run_dir)
    return max(step for tag in tensor_tags(log) for step, _ in values(log, tag))


def last(accumulator, tag):
    return values(accumulator, tag)[-1][1]


def stats(accumulator, layer, tensor):
    return records.decode_stats(last(accumulator, records.stats_tag(layer, tensor)))


def histogram(accumulator, layer, tensor):
    return last(accumulator, records.histogram_tag(layer, tensor))


def routing(accumulator, layer):
    return records.decode_routing(last(accumulator, records.routing_tag(layer)))


def content(accumulator, tag):
    return metadata.parse_plugin_metadata(accumulator.SummaryMetadata(tag).plugin_data.content)


def layers(accumulator):
    """Layer paths that have a stats record, in model order."""
    found = {}
    for tag in tensor_tags(accumulator):
        if tag.endswith("/stats"):
            c = content(accumulator, tag)
            found[c["layer"]] = c["layer_index"]
    return sorted(found, key=found.get)


def assert_record_matches(log, layer, tensor, array, rel=1e-6, abs=1e-12):
    """Asserts that the last records of `layer`'s `tensor` are those of `array`.

    Counts exactly, sums to `rel` or `abs`.
    """
    logged = stats(log, layer, tensor)
    expected = records.decode_stats(summaries.stats_vector(array))
    for field in ("count", "zeros", "nan", "pos_inf", "neg_inf"):
        assert logged[field] == expected[field], (tensor, field)
    for field in ("min", "max", "mean", "std", "sum"):
        # float(): pytest 9.2 takes Python numbers only; a tolerance may be a numpy float32.
        assert logged[field] == pytest.approx(expected[field], rel=float(rel), abs=float(abs)), (
            tensor,
            field,
        )
    counts = histogram(log, layer, tensor)[:, 2]
    assert (
        counts.sum()
        == expected["count"] - expected["nan"] - expected["pos_inf"] - expected["neg_inf"]
    )


def digest_tags(accumulator):
    """The digest series' tags (the budget and loss-scale records share the prefix only)."""
    return [
        tag
        for tag in tensor_tags(accumulator)
        if tag.startswith(digest.TAG_PREFIX + "/")
        and content(accumulator, tag)["kind"] == metadata.KIND_DIGEST
    ]


def assert_digest_equals_records(accumulator):
    """Asserts that each event's digest holds what that event's full records say, for every record.

    Returns:
      The number of events checked.
    """
    tags = digest_tags(accumulator)
    assert len(tags) == 1, tags
    parsed = metadata.parse_plugin_metadata(
        accumulator.SummaryMetadata(tags[0]).plugin_data.content
    )
    rows = parsed["rows"]
    stats_tags = {tag for tag in tensor_tags(accumulator) if tag.endswith("/stats")}
    units_tags = {tag for tag in tensor_tags(accumulator) if tag.endswith("/units")}
    precision_tags = {tag for tag in tensor_tags(accumulator) if tag.endswith("/precision")}
    assert {records.stats_tag(layer, name) for kind, layer, name in rows if kind == "tensor"} == (
        stats_tags
    )
    assert {records.units_tag(layer) for kind, layer, _ in rows if kind == "units"} == units_tags
    assert {
        records.precision_tag(layer, name) for kind, layer, name in rows if kind == "precision"
    } == precision_tags
    by_tag = {tag: dict(values(accumulator, tag)) for tag in stats_tags | units_tags}
    by_tag.update({tag: dict(values(accumulator, tag)) for tag in precision_tags})
    update_tags = [t for t in tensor_tags(accumulator) if "/update/" in t]
    by_tag.update({tag: dict(values(accumulator, tag)) for tag in update_tags})
    events = values(accumulator, tags[0])
    for step, vector in events:
        assert vector.dtype == np.float32
        decoded = digest.decode_digest(rows, vector)
        for (kind, layer, name), fields in decoded.items():
            got = {field: column[0] for field, column in fields.items()}
            if kind == "tensor":
                stats = records.decode_stats(by_tag[records.stats_tag(layer, name)][step])
                finite = stats["count"] - stats["nan"] - stats["pos_inf"] - stats["neg_inf"]
                rms = math.sqrt(stats["mean"] ** 2 + stats["std"] ** 2) if finite else math.nan
                max_abs = max(abs(stats["min"]), abs(stats["max"])) if finite else math.nan
                expected = [*(stats[f] for f in digest.TENSOR_FIELDS[:5]), rms, max_abs]
            elif kind == "units":
                units = records.decode_units(by_tag[records.units_tag(layer)][step])
                expected = [units["channels"], units["dead_channels"]]
            elif kind == "precision":
                record = records.decode_precision(by_tag[records.precision_tag(layer, name)][step])
                blocks = record["block_formats"]
                expected = [record["finite_nonzero"]] + [
                    record["formats"][fmt]["as_is"][count]
                    for fmt in ("float16", "bfloat16")
                    for count in ("to_zero", "subnormal", "overflow")
                ]
                # Of the block part, MXFP8 E4M3's zeros (NaN without it: an earlier layout).
                expected.append(math.nan if blocks is None else blocks["mxfp8_e4m3"]["to_zero"])
            else:
                update = by_tag.get(records.update_tag(layer, name), {}).get(step)
                expected = (
                    [math.nan, math.nan]
                    if update is None
                    else [update[records.UPDATE_RATIO], update[records.UPDATE_INTERVAL]]
                )
            np.testing.assert_array_equal(
                np.array([got[f] for f in digest.FIELDS[kind]], dtype=np.float32),
                np.array(expected, dtype=np.float32),
                err_msg=f"digest row {kind} {layer} {name} at step {step}",
            )
    return len(events)


def assert_same_precision(host, device, tag):
    """Two paths' precision records of one tensor agree: the casts' part bit for bit, and the
    block part (both have it, or neither) its counts exactly and its relative errors to float64
    rounding (their squared sums are taken in another order, and their terms may be fused)."""
    cast = records.PRECISION_CAST_LENGTH
    np.testing.assert_array_equal(host[:cast], device[:cast], err_msg=tag)
    assert len(host) == len(device), (tag, len(host), len(device))
    if len(host) == records.PRECISION_LENGTH:
        fields = records.PRECISION_FIELDS
        errors = [i for i in range(cast, len(fields)) if fields[i].endswith("/relative_error")]
        counts = np.setdiff1d(np.arange(cast, len(fields)), errors)
        np.testing.assert_array_equal(host[counts], device[counts], err_msg=tag)
        # A path may form q * d - v with one rounding less (a fused multiply-add): each term
        # then moves by at most 2**-52 |v|, so the root of the relative error by 2**-52 at most.
        np.testing.assert_allclose(
            np.sqrt(host[errors]), np.sqrt(device[errors]), rtol=1e-9, atol=2.0**-50, err_msg=tag
        )
