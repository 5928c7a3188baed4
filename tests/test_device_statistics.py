"""The device statistics (`capture.device_statistics`) on the Keras backend in use.

Run as each backend's pass runs them: jitted on JAX, XLA-compiled on
TensorFlow (`tf_statistics.compiled`), eagerly on PyTorch. Checked against
the numpy definition (`format.summaries`) and the host kernel: counts, extrema
and histogram edges bit for bit, the summed fields (mean, std, sum, the
routing sums) to float64 rounding (`SUM_RTOL`, and `SUM_ATOL` times the sum
of magnitudes for rows that cancel). Like tests/test_backends.py, this file
is meant to run under every KERAS_BACKEND.
"""

import functools

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from values import awkward_rows  # noqa: E402

from tb_gradviz.capture import assemble, device_statistics  # noqa: E402
from tb_gradviz.format import records, summaries  # noqa: E402

BACKEND = keras.backend.backend()
SUM_RTOL, SUM_ATOL = 1e-9, 1e-12


def run_statistics(arrays, divisor=None, scaled=None):
    """Each array's row of device statistics, grouped and computed as the backend's pass does."""
    scaled = [divisor is not None] * len(arrays) if scaled is None else scaled
    keys = [(a.size, a.dtype.name, s) for a, s in zip(arrays, scaled)]
    groups = device_statistics.chunks(keys)
    one = 1.0 if divisor is None else float(divisor)
    if BACKEND == "jax":
        import jax

        compiled = jax.jit(functools.partial(device_statistics.chunk_statistics, groups, scaled))
        with jax.enable_x64(True):
            results = jax.device_get(compiled(arrays, np.float64(one)))
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        from tb_gradviz.capture.backends import tf_statistics

        results = tf_statistics.compiled(groups, scaled)(
            [tf.constant(a) for a in arrays], tf.constant(one, tf.float64)
        )
    else:
        import torch

        results = device_statistics.chunk_statistics(
            groups, scaled, [torch.as_tensor(a) for a in arrays], one, fused=False
        )
    return device_statistics.tensor_rows(groups, results, [a.size for a in arrays])


def assert_row_is_the_definition(row, values, err_msg):
    histogram, stats = assemble.summary_of_row(row)
    expected = summaries.stats_vector(values)
    exact = np.ones(records.STATS_LENGTH, bool)
    exact[records.SUMMED_STATS] = False
    np.testing.assert_array_equal(stats[exact], expected[exact], err_msg=err_msg)
    scale = np.abs(values[np.isfinite(values)]).sum()
    np.testing.assert_allclose(
        stats[~exact], expected[~exact], rtol=SUM_RTOL, atol=SUM_ATOL * scale, err_msg=err_msg
    )
    np.testing.assert_array_equal(histogram, summaries.linear_histogram(values), err_msg=err_msg)
    with np.errstate(invalid="ignore"):
        raw = [values.sum(), np.abs(values).sum()]
    np.testing.assert_allclose(
        [row["raw_sum"], row["raw_abs_sum"]],
        raw,
        rtol=SUM_RTOL,
        atol=SUM_ATOL * raw[1],
        equal_nan=True,
        err_msg=err_msg,
    )


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("divisor", [None, 1024.0, 3.0])
def test_device_statistics_equal_the_numpy_definition(dtype, divisor):
    rng = np.random.default_rng(5)
    with np.errstate(over="ignore"):  # float16: 3e38 and 1e6 become inf, as intended
        rows = [r.astype(dtype).reshape(4, 9, 9) for r in awkward_rows(rng, 4 * 9 * 9)]
    finite_only = [r for r in rows if np.isfinite(r).all()]
    for group in (rows, finite_only):
        for r, (array, row) in enumerate(zip(group, run_statistics(group, divisor))):
            values = array.astype(np.float64).ravel() / (divisor or 1.0)
            assert_row_is_the_definition(row, values, f"{dtype} / {divisor}, row {r}")


def test_device_counts_equal_the_host_kernel():
    pytest.importorskip("numba")
    from tb_gradviz.capture import kernels

    rng = np.random.default_rng(7)
    rows = awkward_rows(rng, 1000) + [rng.standard_normal(1000).astype(np.float32) * 1e-3]
    for r, (array, row) in enumerate(zip(rows, run_statistics(rows))):
        histogram, stats = assemble.summary_of_row(row)
        host_histogram, host_stats = kernels.summary(array)[:2]
        exact = np.ones(records.STATS_LENGTH, bool)
        exact[records.SUMMED_STATS] = False
        np.testing.assert_array_equal(stats[exact], host_stats[exact], err_msg=f"row {r}")
        np.testing.assert_array_equal(histogram, host_histogram, err_msg=f"row {r}")
        # Rows that cancel (+-3e38) are judged against their sum of magnitudes.
        scale = np.abs(array[np.isfinite(array)].astype(np.float64)).sum()
        np.testing.assert_allclose(
            stats[~exact], host_stats[~exact], rtol=SUM_RTOL, atol=SUM_ATOL * scale
        )


def test_tensors_of_many_sizes_and_dtypes_get_their_own_rows():
    rng = np.random.default_rng(2)
    arrays = [
        (rng.standard_normal(shape) * (i + 1)).astype(dtype)
        for i, (shape, dtype) in enumerate(
            [((3, 5), "float32"), ((15,), "float32"), ((7,), "float64"), ((3, 5), "float16")]
            + [((2, 2), "float32")] * 3
        )
    ]
    scaled = [False, True, False, True, False, False, True]
    rows = run_statistics(arrays, 4.0, scaled)
    for i, (array, row, divided) in enumerate(zip(arrays, rows, scaled)):
        values = array.astype(np.float64).ravel() / (4.0 if divided else 1.0)
        assert row["count"] == array.size
        assert_row_is_the_definition(row, values, f"tensor {i}")


def test_groups_hold_at_most_chunk_values_and_one_tensor_at_least(monkeypatch):
    monkeypatch.setattr(device_statistics, "CHUNK_VALUES", 100)
    keys = [(30, "a"), (30, "a"), (30, "a"), (30, "a"), (500, "a"), (30, "b"), (None, "a")]
    assert device_statistics.chunks(keys) == [[0, 1, 2], [3], [4], [5], [6]]
