"""Reads event files back for tests, through TensorBoard's own event reader."""

import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from tb_gradviz.format import metadata, records, summaries


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
    """Asserts that the last records of `layer`'s `tensor` are those of `array` (sums to `rel` or `abs`)."""
    logged = stats(log, layer, tensor)
    expected = records.decode_stats(summaries.stats_vector(array))
    for field in ("count", "zeros", "nan", "pos_inf", "neg_inf"):
        assert logged[field] == expected[field], (tensor, field)
    for field in ("min", "max", "mean", "std", "sum"):
        # float(): pytest 9.2 takes Python numbers only, and a tolerance may come as a numpy float32.
        assert logged[field] == pytest.approx(expected[field], rel=float(rel), abs=float(abs)), (
            tensor,
            field,
        )
    counts = histogram(log, layer, tensor)[:, 2]
    assert (
        counts.sum()
        == expected["count"] - expected["nan"] - expected["pos_inf"] - expected["neg_inf"]
    )
