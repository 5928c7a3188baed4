"""The float32 kernel's refined magnitude bins: the magnitude histogram and the precision record
from one increment per value, on every edge, every boundary and their neighbours."""

import time

import numpy as np
import pytest

pytest.importorskip("numba")

from test_precision_record import recorded, reference  # noqa: E402

from tb_gradviz.capture import kernels, precision_counts, refined_bins  # noqa: E402
from tb_gradviz.format import precision, records, summaries  # noqa: E402

SUMMED = [records.STATS_FIELDS.index(f) for f in ("mean", "std", "sum")]
EXACT = np.setdiff1d(np.arange(records.STATS_LENGTH), SUMMED)


def float32_of_bits(bits):
    return np.array(bits, np.int64).astype(np.int32).view(np.float32)


def key_neighbours(amax):
    """`amax` and, for each boundary key below it, the float32 magnitudes at the key and one
    pattern either side, both signs."""
    keys, _ = precision_counts.float32_keys(float(amax))
    top = int(np.float32(amax).view(np.int32))
    patterns = {top}
    for key in keys:
        patterns.update(p for p in (key - 1, key, key + 1) if 0 <= p <= top)
    values = float32_of_bits(sorted(patterns))
    return np.concatenate([values, -values])


def assert_kernel_equals_the_definitions(values):
    histogram, stats, vector = kernels.summary(values, precision=True)
    widened = values.astype(np.float64)
    np.testing.assert_array_equal(vector, summaries.precision_vector(values))
    np.testing.assert_array_equal(stats[EXACT], summaries.stats_vector(widened)[EXACT])
    np.testing.assert_array_equal(histogram, summaries.linear_histogram(widened))
    # The record changes no other record.
    without = kernels.summary(values)
    np.testing.assert_array_equal(without[0], histogram)
    np.testing.assert_array_equal(without[1], stats)


AMAXES = sorted(
    {float(np.float32(m * 2.0**e)) for e in range(-140, 128, 3) for m in (1.0, 1.3, 1.75, 1.99)}
    | {float(np.float32(precision.largest(f))) for f in ("float16", "float8_e4m3fn")}
)


@pytest.mark.parametrize("amax", AMAXES[::7])
def test_every_boundary_key_and_its_neighbours_equal_ml_dtypes_casts(amax):
    values = key_neighbours(amax)
    assert recorded(kernels.summary(values, precision=True)[2]) == reference(values)


def test_every_boundary_key_and_its_neighbours_across_float32s_range():
    for amax in AMAXES:
        assert_kernel_equals_the_definitions(key_neighbours(amax))


def test_keys_that_share_a_cell_with_another_edge_are_counted_exactly():
    """A boundary whose cell of bit patterns already holds an edge is no refined edge: an exact
    pass counts it. Found here among the tensors' largest magnitudes, then checked."""
    shared = []
    for exponent in range(-126, 128):
        for mantissa in np.linspace(1.0, 2.0, 65)[:-1]:
            amax = float(np.float32(mantissa * 2.0**exponent))
            keys, _ = precision_counts.float32_keys(amax)
            above_all = int(np.float32(amax).view(np.int32)) + 1
            _, placed = refined_bins.refined_edges(keys, above_all, refined_bins.LOG_KEYS)
            if not np.all(placed | (keys >= above_all) | (keys <= 1)):
                shared.append(amax)
    assert shared, "no largest magnitude gives a key that shares a cell"
    for amax in shared[:: max(1, len(shared) // 40)]:
        values = key_neighbours(amax)
        assert_kernel_equals_the_definitions(values)
        assert recorded(kernels.summary(values, precision=True)[2]) == reference(values)


def test_loss_scaled_and_non_finite_float32_values_take_the_refined_bins_too():
    """The record ignores the divisor: float32 values with one, or with NaN or Inf, are counted
    by their refined bins in a pass of their own, on every key and its neighbours."""
    specials = np.float32([np.nan, np.inf, -np.inf])
    for amax in AMAXES[::3]:
        values = key_neighbours(amax)
        with_specials = np.concatenate([values, specials])
        for v, divisor in ((values, 1024.0), (with_specials, None), (with_specials, 3.0)):
            vector = kernels.summary(v, divisor, precision=True)[2]
            np.testing.assert_array_equal(vector, summaries.precision_vector(v))
    assert recorded(kernels.summary(with_specials, 2.0**15, precision=True)[2]) == reference(
        with_specials
    )
    only_specials = kernels.summary(specials, precision=True)[2]
    np.testing.assert_array_equal(only_specials, summaries.precision_vector(specials))


@pytest.mark.parametrize("record", [False, True])
def test_magnitude_bins_on_every_edge_and_its_neighbours(record):
    edges = records.LOG_EDGES.astype(np.float32)
    f = np.float32
    magnitudes = np.concatenate(
        [edges, np.nextafter(edges, f(0)), np.nextafter(edges, f(np.inf)), [0.0, 1e-45, 1e-40]]
    ).astype(f)
    values = np.concatenate([magnitudes, -magnitudes])
    _, stats = kernels.summary(values, precision=record)[:2]
    expected = summaries.stats_vector(values.astype(np.float64))
    np.testing.assert_array_equal(stats[EXACT], expected[EXACT])
    assert np.all(stats[records.NEGATIVE_BINS.start :] > 0)


def cpu_times(function, values, divisor):
    """Best of seven CPU times of this thread, without the record and with it, interleaved: a busy
    machine slows both alike."""
    function(values, divisor, precision=True)
    with_record, without = [], []
    for _ in range(7):
        start = time.thread_time()
        function(values, divisor)
        middle = time.thread_time()
        function(values, divisor, precision=True)
        with_record.append(time.thread_time() - middle)
        without.append(middle - start)
    return min(without), min(with_record)


def gradient_like(size=1 << 20):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(size) * 2.0 ** rng.uniform(-30, 0, size)).astype(np.float32)


def test_the_precision_record_costs_the_float32_kernel_little_cpu_time():
    """The record's counts come from the increment the kernel makes anyway: with it the kernel
    takes at most a fifth more CPU time, where a second histogram per value would take about half
    more."""
    without, with_record = cpu_times(kernels.summary, gradient_like(), None)
    assert with_record <= 1.2 * without, (with_record, without)


def test_the_precision_record_of_loss_scaled_values_costs_one_pass_of_refined_bins():
    """Loss-scaled float32 values (mixed precision's gradients) take the one-value kernel; their
    record, one pass of refined bins, adds at most half its CPU time, where comparing each value
    with every boundary would more than double it."""
    without, with_record = cpu_times(kernels.summary, gradient_like(), 2.0**15)
    assert with_record <= 1.5 * without, (with_record, without)
