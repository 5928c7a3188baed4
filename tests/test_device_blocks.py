"""The block record on the device (`capture.device_blocks`) against its numpy definition.

Run as each backend's pass runs its statistics: jitted on JAX, XLA-compiled on
TensorFlow (whose CPU backend flushes float32 subnormals to zero), eagerly on
PyTorch. Every count equals `format.blocks.block_record`'s, for each format,
on each format's rounding edges, tensors with zeros, float32 subnormals, NaN
and Inf, partial blocks, a tensor small enough to clamp NVFP4's tensor scale,
and float16, bfloat16 and float64 inputs; the squared sums agree to float64
rounding (XLA may fuse `q * d - v` into one multiply-add, which rounds once
less: the root of the squared error may then move by 2**-52 of the values'
norm). Like tests/test_device_statistics.py, meant to run under every
KERAS_BACKEND.
"""

import math

import ml_dtypes
import numpy as np
import pytest

keras = pytest.importorskip("keras")

from test_block_counts import mixed_tensor  # noqa: E402
from test_block_formats import edges  # noqa: E402

from tb_gradviz.capture import device_blocks  # noqa: E402
from tb_gradviz.format import blocks  # noqa: E402

BACKEND = keras.backend.backend()


def device_records(arrays):
    """Each array's `{format: record}`, grouped by shape and computed as a backend's pass would."""
    shapes = [a.shape for a in arrays]
    width = shapes[0][-1] if shapes[0] else 1
    assert len(set(shapes)) == 1 and len({a.dtype for a in arrays}) == 1
    flat = [a.reshape(-1) for a in arrays]
    if BACKEND == "jax":
        import jax

        compiled = jax.jit(lambda rows: device_blocks.group_blocks(rows, width))
        with jax.enable_x64(True):
            result = jax.device_get(compiled(flat))
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        compiled = tf.function(
            lambda rows: device_blocks.group_blocks(rows, width), jit_compile=True
        )
        result = compiled([tf.constant(a) for a in flat])
    else:
        import torch

        def tensor(a):  # PyTorch takes no ml_dtypes array: bfloat16 goes through float32
            if a.dtype.name == "bfloat16":
                a = torch.as_tensor(a.astype(np.float32)).to(torch.bfloat16)
            return keras.ops.convert_to_tensor(torch.as_tensor(a))  # on Keras' device

        result = device_blocks.group_blocks([tensor(a) for a in flat], width)
    counts = device_blocks.flat_counts(result, width)
    arrays_of = {k: np.asarray(keras.ops.convert_to_numpy(t)) for k, t in counts.items()}
    rows = [{k: a[r] for k, a in arrays_of.items()} for r in range(len(arrays))]
    return [device_blocks.row_records(dict(row, count=arrays[0].size)) for row in rows]


def assert_definition(arrays):
    for array, got in zip(arrays, device_records(arrays)):
        for name in blocks.FORMATS:
            want = blocks.block_record(array, name)
            exact = {k: got[name][k] for k in blocks.COUNTS if not k.startswith("squared")}
            assert exact == {k: want[k] for k in exact}, name
            total = want["squared_sum"]
            assert got[name]["squared_sum"] == pytest.approx(total, rel=1e-12)
            # Each difference q * d - v may be formed with one rounding less (a fused
            # multiply-add): a term moves by at most 2**-52 |v|, so the root of the squared error
            # (the norm of the differences) by at most 2**-52 times the root of the sum.
            assert math.sqrt(got[name]["squared_error"]) == pytest.approx(
                math.sqrt(want["squared_error"]), rel=1e-9, abs=2.0**-50 * math.sqrt(total)
            ), name


@pytest.mark.parametrize("name", sorted(blocks.FORMATS))
def test_each_formats_rounding_edges(name):
    values = edges(name)
    assert blocks.block_record(values, name)["to_zero"] > 0
    assert_definition([values, -values])


@pytest.mark.parametrize("shape", [(5,), (3, 47), (4, 2, 64), (2, 16), (1, 33)])
def test_tensors_with_zeros_float32_subnormals_nan_and_inf(shape):
    arrays = [mixed_tensor(shape, seed) for seed in range(3)]
    assert_definition(arrays)


def test_float32_subnormals_count_where_the_device_flushes_them():
    """A block whose values are all float32 subnormals: every format scales them up (MX by a power
    of two, NVFP4 by its tensor scale), so none is lost, on XLA's CPU backend too."""
    values = np.array([[1e-40, -3e-41, 7e-45, 2e-39] * 8], np.float32)
    got = device_records([values])[0]
    assert got["mxfp8_e4m3"]["to_zero"] == blocks.block_record(values, "mxfp8_e4m3")["to_zero"]
    assert got["nvfp4"]["squared_sum"] > 0
    assert_definition([values])


def test_a_tiny_tensor_clamps_the_nvfp4_tensor_scale():
    assert_definition([np.array([[1e-36, -3e-37, 2e-40, 0.0] * 8, [0.0] * 32], np.float32)])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_narrow_and_wide_inputs(dtype):
    rng = np.random.default_rng(7)
    values = rng.standard_normal((6, 40)) * np.exp(rng.uniform(-12, 12, (6, 40)))
    if dtype == "float64":  # values that round to float32 subnormals, and past float32's range
        values[0, :4] = [3e-41, -1.5e-45, 7e-46, 4e38]
    with np.errstate(over="ignore"):  # float16's range ends at 65504: those become Inf
        cast = values.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    assert_definition([cast])


def test_an_empty_tensor_has_no_blocks():
    got = device_records([np.zeros((2, 0), np.float32)])[0]
    assert got == {name: blocks.block_record(np.zeros((2, 0)), name) for name in blocks.FORMATS}


def test_a_scalar_is_one_block_of_one_value():
    got = device_records([np.array(3.0, np.float32)])[0]
    assert got == {name: blocks.block_record(np.float32(3.0), name) for name in blocks.FORMATS}


def test_blocks_are_counted_from_the_shape():
    assert device_blocks.block_counts(lines=3, width=47) == {16: 9, 32: 6}
    assert math.prod((3,)) * 2 == device_blocks.block_counts(3, 32)[32] * 2
