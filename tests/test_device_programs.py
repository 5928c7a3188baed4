"""Device statistics compile once per distinct group (`device_statistics.GroupPrograms`): the
tensors of layers of one shape run one compiled program, traced once, and a second event traces
nothing. Run under JAX (jitted) and TensorFlow (XLA); PyTorch runs its statistics eagerly."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from tb_gradviz.capture import assemble, device_statistics, kernels  # noqa: E402
from tb_gradviz.format import records  # noqa: E402

BACKEND = keras.backend.backend()
pytestmark = pytest.mark.skipif(BACKEND == "torch", reason="PyTorch compiles nothing")
SUMMED = [records.STATS_FIELDS.index(f) for f in ("mean", "std", "sum")]
EXACT = np.setdiff1d(np.arange(records.STATS_LENGTH), SUMMED)


def compile_and_run():
    """`(compile, run)`: the backend's compiler as its pass uses it, and a call of a
    `GroupPrograms` that returns numpy."""
    if BACKEND == "jax":
        import jax

        def run(programs, groups, tensors, widths):
            with jax.enable_x64(True):
                return jax.device_get(
                    programs(groups, [False] * len(tensors), tensors, np.float64(1.0), widths)
                )

        return jax.jit, run
    import tensorflow as tf

    def run(programs, groups, tensors, widths):
        divisor = tf.constant(1.0, tf.float64)
        results = programs(groups, [False] * len(tensors), tensors, divisor, widths)
        return [{k: v.numpy() for k, v in r.items()} for r in results]

    return (lambda f: tf.function(f, jit_compile=True, autograph=False)), run


def layer_tensors(shapes, seed):
    """Normal float32 values (no subnormals: XLA's CPU backend flushes them) of each shape."""
    rng = np.random.default_rng(seed)
    arrays = []
    for shape in shapes:
        values = rng.standard_normal(shape) * np.exp(rng.uniform(-10, 10, shape))
        values[rng.random(shape) < 0.2] = 0
        arrays.append(values.astype(np.float32))
    return arrays


def test_layers_of_one_shape_run_one_program_traced_once():
    # Three layers' tensors of one shape, each a group of its own (a group stacks at most
    # CHUNK_VALUES values), and one small tensor of another shape.
    big = (device_statistics.CHUNK_VALUES // 512, 512)
    arrays = layer_tensors([big, big, big, (6, 64)], seed=1)
    widths = [a.shape[-1] for a in arrays]
    keys = [(a.size, "float32", False, w) for a, w in zip(arrays, widths)]
    groups = device_statistics.chunks(keys)
    assert len(groups) == 4
    compile, run = compile_and_run()
    mode = device_statistics.mode_for("cpu")
    programs = device_statistics.GroupPrograms(compile, mode)
    tensors = [keras.ops.convert_to_tensor(a) for a in arrays]
    results = run(programs, groups, tensors, widths)
    assert programs.traces == 2 and len(programs.programs) == 2
    run(programs, groups, tensors, widths)  # the next event
    assert programs.traces == 2

    rows = device_statistics.tensor_rows(groups, results, [a.size for a in arrays])
    for array, row in zip(arrays, rows):
        histogram, stats, precision = assemble.summary_of_row(row)
        want = kernels.summary(array, precision=True, block_formats=True)
        np.testing.assert_array_equal(histogram, want[0])
        np.testing.assert_array_equal(stats[EXACT], want[1][EXACT])
        np.testing.assert_allclose(stats, want[1], rtol=1e-12)
        np.testing.assert_allclose(precision, want[2], rtol=1e-9, atol=0)


def test_without_the_block_part_one_program_per_rows_and_length():
    arrays = layer_tensors([(4, 96)] * 3 + [(2, 96)], seed=2)
    keys = [(a.size, "float32", False, None) for a in arrays]
    groups = device_statistics.chunks(keys)
    assert [len(g) for g in groups] == [3, 1]
    compile, run = compile_and_run()
    programs = device_statistics.GroupPrograms(compile, device_statistics.mode_for("cpu"))
    tensors = [keras.ops.convert_to_tensor(a) for a in arrays]
    first = run(programs, groups, tensors, None)
    again = run(programs, groups, tensors, None)
    assert programs.traces == 2
    for a, b in zip(first, again):
        assert sorted(a) == sorted(b) and "block_width" not in a
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
