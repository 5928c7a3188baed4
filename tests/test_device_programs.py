"""Device statistics compile once per distinct chunk (`device_programs.GroupPrograms`): tensors of
any shapes are packed into chunks of a few shapes, which run a few compiled programs, each traced
once, and a second event traces nothing. Run under JAX (jitted) and TensorFlow (XLA); PyTorch
runs its statistics eagerly."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from tb_gradviz.capture import (  # noqa: E402
    assemble,
    device_packing,
    device_programs,
    device_statistics,
    kernels,
)
from tb_gradviz.format import records  # noqa: E402

BACKEND = keras.backend.backend()
pytestmark = pytest.mark.skipif(BACKEND == "torch", reason="PyTorch compiles nothing")
SUMMED = [records.STATS_FIELDS.index(f) for f in ("mean", "std", "sum")]
EXACT = np.setdiff1d(np.arange(records.STATS_LENGTH), SUMMED)


def programs_and_run():
    """`(programs, run)`: `GroupPrograms` as the backend's pass builds them (on the CPU), and a
    call of them as the pass makes it, which returns numpy."""
    mode = device_statistics.mode_for("cpu")
    if BACKEND == "jax":
        import jax

        def run(programs, groups, tensors, widths):
            with jax.enable_x64(True):
                return jax.device_get(
                    programs(groups, [False] * len(tensors), tensors, np.float64(1.0), widths)
                )

        return device_programs.GroupPrograms(jax.jit, mode), run
    import tensorflow as tf

    from tb_gradviz.capture.backends import tf_statistics

    def run(programs, groups, tensors, widths):
        @tf.function(autograph=False)  # the pass's own function: the packing is in its graph
        def statistics(tensors):
            divisor = tf.constant(1.0, tf.float64)
            return programs(groups, [False] * len(tensors), tensors, divisor, widths)

        return [{k: v.numpy() for k, v in r.items()} for r in statistics(tensors)]

    programs = device_programs.GroupPrograms(tf_statistics._compile, mode, compile_packing=False)
    return programs, run


def layer_tensors(shapes, seed):
    """Normal float32 values (no subnormals: XLA's CPU backend flushes them) of each shape."""
    rng = np.random.default_rng(seed)
    arrays = []
    for shape in shapes:
        values = rng.standard_normal(shape) * np.exp(rng.uniform(-10, 10, shape))
        values[rng.random(shape) < 0.2] = 0
        arrays.append(values.astype(np.float32))
    return arrays


def assert_host_kernel(arrays, results, groups):
    rows = device_statistics.tensor_rows(groups, results, [a.size for a in arrays])
    for array, row in zip(arrays, rows):
        histogram, stats, precision = assemble.summary_of_row(row)
        want = kernels.summary(array, precision=True, block_formats=True)
        np.testing.assert_array_equal(histogram, want[0])
        np.testing.assert_array_equal(stats[EXACT], want[1][EXACT])
        np.testing.assert_allclose(stats, want[1], rtol=1e-12)
        np.testing.assert_allclose(precision, want[2], rtol=1e-9, atol=0)


def test_layers_of_many_shapes_run_a_few_programs_traced_once(monkeypatch):
    # Chunks of 4 rows: tensors of 9 shapes (lines of 3, 10, 100 and 130 values padded to whole
    # blocks) fill chunks of one shape, grown to 16 rows for the longest that fits (5 x 4000 in
    # 5 rows, 20 x 4096 not); a tensor longer still (20 rows) runs in one of its own.
    monkeypatch.setattr(device_statistics, "CHUNK_VALUES", 4 * device_packing.ROW_VALUES)
    shapes = [(8, 8, 3), (4, 4, 64), (6, 10), (2, 100), (5, 4000), (3, 7, 7, 32), (64,), (1, 3)]
    arrays = layer_tensors(shapes + [(4, 4, 64), (2, 100), (70, 130)], seed=1)
    widths = [a.shape[-1] for a in arrays]
    sizes = [a.size for a in arrays]
    grown = device_packing.layout(
        sizes, ["float32"] * len(sizes), [False] * len(sizes), widths, 4 * 4096
    )
    assert {(c.rows, c.slots) for c in grown} == {(8, device_packing.SLOTS)}
    arrays.append(layer_tensors([(20, 4096)], seed=4)[0])
    widths.append(4096)
    keys = [(a.size, "float32", False, w) for a, w in zip(arrays, widths)]
    groups = device_statistics.chunks(keys)
    programs, run = programs_and_run()
    tensors = [keras.ops.convert_to_tensor(a) for a in arrays]
    results = run(programs, groups, tensors, widths)
    assert sorted(key[0][1] for key in programs.programs) == [16, 32]
    assert programs.traces == len(programs.programs) == 2, sorted(programs.programs)
    traced = (programs.traces, programs.pack_traces)
    run(programs, groups, tensors, widths)  # the next event
    assert (programs.traces, programs.pack_traces) == traced
    assert_host_kernel(arrays, results, groups)


def test_a_dtypes_last_chunk_after_full_ones_keeps_their_shape_and_program(monkeypatch):
    # Chunks of 4 rows: seven tensors of 1.5 rows (2 rows each, padded) fill three chunks, and
    # the fourth, of 2 rows used, keeps the full shape: one program runs them all. Alone, a
    # partial chunk is cut to powers of two.
    monkeypatch.setattr(device_statistics, "CHUNK_VALUES", 4 * device_packing.ROW_VALUES)
    rows = 1.5 * device_packing.ROW_VALUES
    arrays = layer_tensors([(int(rows) // 64, 64)] * 7, seed=3)
    keys = [(a.size, "float32", False, None) for a in arrays]
    groups = device_statistics.chunks(keys)
    chunked = device_packing.layout(
        [a.size for a in arrays], ["float32"] * 7, [False] * 7, None, 4 * device_packing.ROW_VALUES
    )
    slots = device_packing.SLOTS
    assert [(c.rows, c.slots, len(c.tensors)) for c in chunked] == [(4, slots, 2)] * 3 + [
        (4, slots, 1)
    ]
    alone = device_packing.layout([arrays[0].size], ["float32"], [False], None, 4 * 4096)
    assert [(c.rows, c.slots) for c in alone] == [(2, 1)]
    programs, run = programs_and_run()
    tensors = [keras.ops.convert_to_tensor(a) for a in arrays]
    results = run(programs, groups, tensors, None)
    assert programs.traces == len(programs.programs) == 1, sorted(programs.programs)
    rows = device_statistics.tensor_rows(groups, results, [a.size for a in arrays])
    for array, row in zip(arrays, rows):
        histogram, stats, _ = assemble.summary_of_row(row)
        want = kernels.summary(array)
        np.testing.assert_array_equal(histogram, want[0])
        np.testing.assert_array_equal(stats[EXACT], want[1][EXACT])


def test_without_the_block_part_the_same_program_for_every_shape():
    arrays = layer_tensors([(4, 96)] * 3 + [(2, 96), (5, 7)], seed=2)
    keys = [(a.size, "float32", False, None) for a in arrays]
    groups = device_statistics.chunks(keys)
    assert [len(g) for g in groups] == [3, 1, 1]
    programs, run = programs_and_run()
    tensors = [keras.ops.convert_to_tensor(a) for a in arrays]
    first = run(programs, groups, tensors, None)
    again = run(programs, groups, tensors, None)
    assert programs.traces == 1
    for a, b in zip(first, again):
        assert sorted(a) == sorted(b) and "block_width" not in a
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
