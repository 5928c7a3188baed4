"""The host kernel against records' numpy definition of the records."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tb_gradviz.capture import in_step, in_step_kernel, kernels
from tb_gradviz.format import records, summaries

SUMMED = [records.STATS_FIELDS.index(f) for f in ("mean", "std", "sum")]
EXACT = np.setdiff1d(np.arange(records.STATS_LENGTH), SUMMED)


def assert_records_equal(values, divisor=None):
    histogram, stats = kernels.summary(values, divisor)
    widened = np.asarray(values, np.float64).ravel() / (1.0 if divisor is None else divisor)
    expected = summaries.stats_vector(widened)
    np.testing.assert_array_equal(stats[EXACT], expected[EXACT])
    # Sums agree to float64 rounding, judged against the sum of |x| (values may cancel).
    scale = np.abs(widened[np.isfinite(widened)]).sum()
    np.testing.assert_allclose(stats[SUMMED], expected[SUMMED], rtol=1e-12, atol=1e-13 * scale)
    np.testing.assert_array_equal(histogram, summaries.linear_histogram(widened))


def edge_neighbours():
    """Every magnitude edge, every power of two in float32's range, and their float64 neighbours."""
    points = np.concatenate([records.LOG_EDGES, np.ldexp(1.0, np.arange(-149, 128))])
    down, up = np.nextafter(points, 0), np.nextafter(points, np.inf)
    return np.concatenate([points, down, up, np.nextafter(down, 0), np.nextafter(up, np.inf)])


def test_octave_lookup_is_searchsorted_on_every_edge_and_its_neighbours():
    magnitudes = np.concatenate([edge_neighbours(), [5e-324, 2.2e-308, 1e-300, 1e150]])
    values = np.concatenate([magnitudes, -magnitudes])
    _, stats = kernels.summary(values)
    expected = summaries.stats_vector(values)
    np.testing.assert_array_equal(
        stats[records.NEGATIVE_BINS.start :], expected[records.NEGATIVE_BINS.start :]
    )
    # The bins are not all alike: every one of the 2 x 38 holds some of these values.
    assert np.all(stats[records.NEGATIVE_BINS.start :] > 0)


def test_float32_edge_neighbours_and_specials():
    f = np.float32
    edges = records.LOG_EDGES.astype(f)
    values = np.concatenate(
        [
            edges,
            np.nextafter(edges, f(0)),
            np.nextafter(edges, f(np.inf)),
            [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-40],
        ]
    ).astype(f)
    values = np.concatenate([values, -values])
    assert_records_equal(values)
    _, stats = kernels.summary(values)
    record = records.decode_stats(stats)
    # The four zeros are +-0.0 only: float32 subnormals are non-zero values
    # here, in magnitude bin 0, as records defines (no flush-to-zero).
    assert (
        record["count"],
        record["zeros"],
        record["nan"],
        record["pos_inf"],
        record["neg_inf"],
    ) == (len(values), 4, 2, 2, 2)


@pytest.mark.parametrize(
    "values",
    [
        np.zeros(0, np.float32),
        np.zeros(7, np.float32),
        np.full(5, np.nan, np.float32),
        np.full(5, 2.5, np.float32),
        np.array([np.inf, -np.inf, 3.0], np.float32),
        np.array([-1.0, 1.0], np.float64),
        np.arange(-1000, 1000, dtype=np.float32) / 7,  # values on bucket edges
    ],
    ids=["empty", "zeros", "all-nan", "all-equal", "one-finite", "two", "bucket-edges"],
)
def test_degenerate_inputs(values):
    assert_records_equal(values)


def test_empty_and_all_nan_give_nan_extrema_and_an_empty_histogram():
    for values in (np.zeros(0, np.float32), np.full(3, np.nan, np.float32)):
        histogram, stats = kernels.summary(values)
        assert np.isnan(stats[5:10]).all()
        np.testing.assert_array_equal(histogram, np.zeros((records.HISTOGRAM_BUCKETS, 3)))


@pytest.mark.parametrize("divisor", [1024.0, 3.0, 2.0**-10])
def test_the_divisor_divides_the_widened_values(divisor):
    rng = np.random.default_rng(1)
    values = (rng.standard_normal(5000) * 10.0 ** rng.uniform(-8, 4, 5000)).astype(np.float32)
    values[:3] = [np.nan, np.inf, 0.0]
    assert_records_equal(values, divisor)


def test_multidimensional_and_non_contiguous_arrays():
    rng = np.random.default_rng(2)
    block = rng.standard_normal((4, 6, 6, 8)).astype(np.float32)
    assert_records_equal(block)
    assert_records_equal(block[:, ::2, :, 1:5])  # a strided view


finite_or_special = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    st.sampled_from([0.0, -0.0, 1e-12, 1e6, float(np.float32(10**-0.5))]),
)


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(0, 300), elements=finite_or_special))
def test_any_float32_array(values):
    assert_records_equal(values)


@settings(max_examples=100, deadline=None)
# A span wider than float64's range would overflow the bucket width, in records too.
@given(
    hnp.arrays(
        np.float64,
        st.integers(0, 200),
        elements=st.one_of(
            st.floats(-1e150, 1e150), st.sampled_from([np.nan, np.inf, -np.inf, -0.0])
        ),
    )
)
def test_any_float64_array(values):
    assert_records_equal(values)


def test_threads_give_the_sequential_results_in_input_order():
    rng = np.random.default_rng(3)
    items = [
        (rng.standard_normal(size).astype(np.float32), divisor)
        for size in (10, 100_000, 3, 5000)
        for divisor in (None, 8.0)
    ]
    threaded = kernels.summaries(items, workers=2)
    for (values, divisor), (histogram, stats) in zip(items, threaded):
        expected_histogram, expected_stats = kernels.summary(values, divisor)
        np.testing.assert_array_equal(histogram, expected_histogram)
        np.testing.assert_array_equal(stats, expected_stats)


def test_other_dtypes_are_refused_with_what_was_received():
    with pytest.raises(TypeError, match="float32 or float64 values; received int32"):
        kernels.summary(np.arange(3, dtype=np.int32))
    with pytest.raises(TypeError, match="received float16"):
        kernels.summary(np.ones(3, np.float16))


@pytest.mark.parametrize("kind", ["normal", "relu", "wide", "all-negative"])
def test_float32_kernel_over_many_blocks_equals_the_definition_and_the_one_value_kernel(kind):
    rng = np.random.default_rng(6)
    size = 3 * kernels._BLOCK + 123
    values = {
        "normal": rng.standard_normal(size),
        "relu": np.maximum(rng.standard_normal(size), 0),
        "wide": rng.standard_normal(size) * 10.0 ** rng.uniform(-40, 38, size),
        "all-negative": -rng.random(size) - 1e-3,
    }[kind].astype(np.float32)
    assert_records_equal(values)
    fast = kernels.summary(values)
    one_at_a_time = kernels._summary(
        values, 1.0, records.HISTOGRAM_BUCKETS, kernels._OCTAVE_BIN, kernels._OCTAVE_EDGE
    )
    np.testing.assert_array_equal(fast[0], one_at_a_time[0])
    np.testing.assert_array_equal(fast[1][EXACT], one_at_a_time[1][EXACT])


def test_equal_values_fill_the_last_bucket_as_tensorboards_own_histogram():
    # Issue 11, defect 4: TensorBoard's histogram summary puts the count of equal
    # values in the last bucket; records' definition and the kernel now do too.
    from tensorboard.plugins.histogram import summary_v2
    from tensorboard.util import tensor_util

    for values in (np.full(7, 2.5), np.array([-1.0]), np.full((3, 4), 0.0)):
        proto = summary_v2.histogram_pb("t", values, buckets=records.HISTOGRAM_BUCKETS)
        theirs = tensor_util.make_ndarray(proto.value[0].tensor)
        np.testing.assert_array_equal(summaries.linear_histogram(values), theirs)
        histogram, _ = kernels.summary(values.astype(np.float32))
        np.testing.assert_array_equal(histogram, theirs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_update_sums_equal_the_definition_and_leave_the_current_values_in_previous(dtype):
    rng = np.random.default_rng(5)
    current = rng.normal(size=(3, 3, 16, 32)).astype(dtype)
    previous = (current + rng.normal(scale=1e-3, size=current.shape)).astype(dtype)
    expected = summaries.update_sums(current, previous)
    kept = previous.copy()
    weight, update = in_step_kernel.update_sums(current, kept)
    assert weight == pytest.approx(expected[0], rel=1e-12)
    assert update == pytest.approx(expected[1], rel=1e-12)
    assert expected[1] == pytest.approx(
        float(np.sum((current.astype(np.float64) - previous) ** 2)), rel=1e-12
    )
    np.testing.assert_array_equal(kept, current)
    with pytest.raises(
        ValueError, match=r"contiguous float32 array of 4608 values; received float64, 4608"
    ):
        in_step_kernel.update_sums(current.astype(np.float32), previous.astype(np.float64))


def in_step_row_definition(values, units_last):
    """`in_step_kernel.statistics_row` by numpy: counts below each threshold, the non-finite
    counts, then over the finite values the sum of squares and max |x|, and the channels (last
    axis) zero everywhere."""
    finite = values[np.isfinite(values)].astype(np.float64)
    below = [np.count_nonzero(np.abs(finite) < np.float32(t)) for t in in_step.THRESHOLDS]
    counts = [np.count_nonzero(np.isnan(values)), np.count_nonzero(values == np.inf)]
    counts.append(np.count_nonzero(values == -np.inf))
    dead = np.count_nonzero(~np.any(values != 0, axis=tuple(range(values.ndim - 1))))
    largest = np.max(np.abs(finite)) if finite.size else 0.0
    row = [values.size, *below, *counts, np.sum(finite * finite), largest]
    return np.array(row + [dead if units_last else 0])


@pytest.mark.parametrize("shape", [(97, 5, 64), (3000, 3), (4, 5000), (70001,), (0, 8)])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_the_in_step_rows_of_many_blocks_equal_their_numpy_definition(shape, nonfinite):
    # Values on each threshold and beside it, zeros of both signs, and dead channels, over many
    # of the kernel's blocks of whole lines (and a line longer than a block).
    rng = np.random.default_rng(sum(shape))
    values = (rng.standard_normal(shape) * np.exp(rng.uniform(-40, 40, shape))).astype(np.float32)
    flat = values.reshape(-1)
    edges = np.array(in_step.THRESHOLDS, np.float32)
    near = np.concatenate([edges, np.nextafter(edges, 0), -edges, [0.0, -0.0]]).astype(np.float32)
    if flat.size:
        flat[rng.integers(0, flat.size, 400)] = rng.choice(near, 400)
        if values.ndim > 1 and values.shape[-1] > 2:
            values[..., 1] = 0.0
            values[..., 2] = -0.0
        if nonfinite:
            flat[rng.integers(0, flat.size, 3)] = [np.nan, np.inf, -np.inf]
    for units_last in (False, True):
        found = in_step_kernel.statistics_row(values, units_last)
        expected = in_step_row_definition(values, units_last)
        counts = len(in_step.COUNT_FIELDS)
        np.testing.assert_array_equal(found[:counts], expected[:counts])
        np.testing.assert_allclose(found[counts:-1], expected[counts:-1], rtol=1e-12)
        assert found[-1] == expected[-1]
