"""The precision record against ml_dtypes' casts: every count, each format's rounding edges."""

import importlib.util

import ml_dtypes
import numpy as np
import pytest

from tb_gradviz.format import precision, records, summaries

DTYPES = {
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


def to_float32_odd(exact):
    """float64 values to float32, rounded to odd: ml_dtypes casts float64 through float32, and a
    product below float32's normal range would otherwise be rounded twice. Rounding to odd first
    keeps the second rounding (to a format with far fewer bits) correct."""
    rounded = exact.astype(np.float32)
    inexact = rounded.astype(np.float64) != exact
    toward_zero = np.where(
        np.abs(rounded.astype(np.float64)) > np.abs(exact),
        np.nextafter(rounded, np.float32(0)),
        rounded,
    )
    bits = toward_zero.view(np.uint32) | np.uint32(1)
    return np.where(inexact, bits.view(np.float32), rounded)


def cast_counts(values, dtype, scale=1.0):
    """`{to_zero, subnormal, overflow}` of casting the finite `values` (float32) times `scale`
    (a power of two, applied in float64) to `dtype`."""
    values = np.asarray(values, np.float32)
    values = values[np.isfinite(values)]
    with np.errstate(over="ignore", invalid="ignore"):
        cast = to_float32_odd(values.astype(np.float64) * scale).astype(dtype).astype(np.float64)
    smallest_normal = float(ml_dtypes.finfo(dtype).smallest_normal)
    finite = np.isfinite(cast)
    return {
        "to_zero": int(np.count_nonzero((cast == 0) & (values != 0))),
        "subnormal": int(np.count_nonzero(finite & (cast != 0) & (np.abs(cast) < smallest_normal))),
        "overflow": int(np.count_nonzero(~finite)),
    }


def reference(values):
    """The record's counts, from ml_dtypes' casts: `{format: {setting: counts}}`."""
    values = np.asarray(values, np.float32)
    finite = values[np.isfinite(values)]
    amax = float(np.abs(finite).max()) if finite.size else 0.0
    result = {}
    for name, dtype in DTYPES.items():
        k = precision.scale_exponent(amax, name)
        result[name] = {
            "as_is": cast_counts(values, dtype),
            "scaled": cast_counts(values, dtype, 2.0**k),
            "scale_exponent": k,
        }
    return result


def recorded(vector):
    decoded = records.decode_precision(vector)
    return {
        name: {key: value for key, value in counts.items()}
        for name, counts in decoded["formats"].items()
    }


def edge_values():
    """Each format's rounding edges and their float32 neighbours, signed zeros, NaN and Inf."""
    edges = [0.0, -0.0, np.nan, np.inf, -np.inf]
    for dtype in DTYPES.values():
        info = ml_dtypes.finfo(dtype)
        smallest = float(info.smallest_subnormal)
        top = float(info.max)
        ulp = 2.0 ** (np.frexp(top)[1] - 1 - info.nmant)
        for value in (
            smallest / 2,
            smallest,
            float(info.smallest_normal) - smallest / 2,
            float(info.smallest_normal),
            top,
            top + ulp / 2,
            top + ulp,
        ):
            with np.errstate(over="ignore"):
                f = np.float32(value)
            edges += [f, np.nextafter(f, np.float32(0)), np.nextafter(f, np.float32(np.inf))]
    edges = np.array(edges, np.float32)
    return np.concatenate([edges, -edges])


def test_boundaries_are_where_ml_dtypes_rounds():
    """Each boundary casts as its side says, and its float32 neighbours on the other side."""
    for name, dtype in DTYPES.items():
        for kind, (b, inclusive) in precision.BOUNDARIES[name].items():
            values = np.array(
                [
                    np.nextafter(np.float32(b), np.float32(0)),
                    b,
                    np.nextafter(np.float32(b), np.float32(np.inf)),
                ],
                np.float32,
            )
            assert float(values[1]) == b, (name, kind)
            counts = [cast_counts([v], dtype) for v in values]
            if kind == "zero":
                outcome = [c["to_zero"] for c in counts]
            elif kind == "normal":
                outcome = [c["subnormal"] + c["to_zero"] for c in counts]
            else:
                outcome = [1 - c["overflow"] for c in counts]
            assert outcome == [1, int(inclusive), 0], (name, kind, outcome)


def test_edges_equal_ml_dtypes_casts():
    values = edge_values()
    expected = reference(values)
    assert recorded(summaries.precision_vector(values)) == expected
    assert records.decode_precision(summaries.precision_vector(values))["finite_nonzero"] == int(
        np.count_nonzero(np.isfinite(values) & (values != 0))
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spread", [(-30, 4), (-150, 128), (-12, 20)])
def test_random_values_equal_ml_dtypes_casts(seed, spread):
    rng = np.random.default_rng(seed)
    exponents = rng.uniform(*spread, size=5000)
    values = (np.sign(rng.normal(size=5000)) * 2.0**exponents).astype(np.float32)
    values[rng.integers(0, 5000, 50)] = 0.0
    assert recorded(summaries.precision_vector(values)) == reference(values)


def test_scale_exponent_keeps_amax_finite():
    for name in precision.FORMATS:
        top = precision.largest(name)
        for amax in (top, np.nextafter(top, 0), np.nextafter(top, np.inf), 1e-30, 3.0, 1e30):
            k = precision.scale_exponent(amax, name)
            assert amax * 2.0**k <= top < amax * 2.0 ** (k + 1)
        assert precision.scale_exponent(0.0, name) == 0
        assert precision.scale_exponent(np.inf, name) == 0


def test_decode_precision_rejects_other_lengths():
    with pytest.raises(ValueError, match="precision record has"):
        records.decode_precision(np.zeros(records.PRECISION_LENGTH + 1))


def kernel_precision(values, divisor=None):
    from tb_gradviz.capture import kernels

    return kernels.summary(values, divisor, precision=True)[2]


@pytest.mark.parametrize("scale", [1.0, 2.0**-100, 2.0**60, 2.0**-130])
def test_host_kernel_equals_the_definition(scale):
    """The float32 kernel (histogram by exponent field and significand), and the one-value-at-a-time
    kernel (float64, a divisor, NaN or Inf), on the edges and on values across float32's range."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(1)
    spread = (np.sign(rng.normal(size=20000)) * 2.0 ** rng.uniform(-149, 127, 20000)).astype(
        np.float32
    )
    powers = (2.0 ** rng.integers(-149, 127, 2000)).astype(np.float32)  # exactly on boundaries
    finite = [v[np.isfinite(v)] for v in (edge_values(), spread, powers)]
    for values in finite + [edge_values()]:
        with np.errstate(over="ignore", under="ignore"):
            scaled = (values.astype(np.float64) * scale).astype(np.float32)
        expected = summaries.precision_vector(scaled)
        np.testing.assert_array_equal(kernel_precision(scaled), expected)
        np.testing.assert_array_equal(kernel_precision(scaled.astype(np.float64)), expected)
        # A divisor divides the stats' values, never the precision record's.
        np.testing.assert_array_equal(kernel_precision(scaled, 1024.0), expected)


def test_host_kernel_on_one_bin_that_holds_a_key():
    """e4m3fn's overflow key (|x| > 464) is on no edge of its bin: counted exactly when the bin
    holds values."""
    values = np.array([464.0, 464.0, np.nextafter(np.float32(464), np.float32(1e9)), 470.0, 1.0])
    values = values.astype(np.float32)
    record = records.decode_precision(kernel_precision(values))
    assert record["formats"]["float8_e4m3fn"]["as_is"]["overflow"] == 2
    np.testing.assert_array_equal(kernel_precision(values), summaries.precision_vector(values))


def test_a_tensor_with_no_finite_non_zero_value_has_scale_exponent_0_and_no_count():
    # FORMAT.md: `k` has no largest value then, and is written as 0.
    for values in (np.zeros(6), np.array([0.0, np.nan, np.inf, -np.inf]), np.full(3, np.nan)):
        vectors = [summaries.precision_vector(values)]
        if importlib.util.find_spec("numba"):
            vectors += [kernel_precision(values.astype(np.float32)), kernel_precision(values)]
        for vector in vectors:
            record = records.decode_precision(vector)
            assert record["finite_nonzero"] == 0
            for name in precision.FORMATS:
                entry = record["formats"][name]
                assert entry["scale_exponent"] == 0
                for setting in precision.SETTINGS:
                    assert set(entry[setting].values()) == {0}, (values, name, setting)
