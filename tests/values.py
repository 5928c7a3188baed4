"""Values that exercise every branch of the statistics, for the tests of each fast path."""

import numpy as np

from tb_gradviz.format import records


def awkward_rows(rng, size):
    """Rows that exercise every branch of the statistics: NaN, ±Inf, zeros of
    both signs, all equal, nothing finite, values on and next to every
    magnitude edge (both signs), and a wide spread of magnitudes."""
    f32 = np.float32
    edges = records.LOG_EDGES.astype(f32)
    near = np.concatenate(
        [edges, np.nextafter(edges, f32(0)), np.nextafter(edges, f32(np.inf)), [1e-13, 1e-37, 3e38]]
    )
    near = np.concatenate([near, -near]).astype(f32)
    rows = [
        rng.standard_normal(size).astype(f32),
        np.resize(near, size),
        (rng.standard_normal(size) * 10.0 ** rng.uniform(-14, 8, size)).astype(f32),
        np.zeros(size, f32),
        np.full(size, -0.0, f32),
        np.full(size, 2.5, f32),
        np.full(size, np.nan, f32),
    ]
    special = rng.standard_normal(size).astype(f32)
    special[:5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    rows.append(special)
    return rows


def assert_same_stats(actual, expected, rtol, atol=0.0, err_msg=""):
    """Stats records: every field exact but the summed ones (`records.SUMMED_STATS`), to `rtol`."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    exact = np.ones(actual.shape[-1], bool)
    exact[records.SUMMED_STATS] = False
    np.testing.assert_array_equal(actual[..., exact], expected[..., exact], err_msg=err_msg)
    np.testing.assert_allclose(
        actual[..., records.SUMMED_STATS],
        expected[..., records.SUMMED_STATS],
        rtol=rtol,
        atol=atol,
        err_msg=err_msg,
    )
