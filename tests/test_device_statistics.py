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
import re

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from values import awkward_rows  # noqa: E402

from tb_gradviz.capture import assemble, device_statistics  # noqa: E402
from tb_gradviz.format import records, summaries  # noqa: E402

BACKEND = keras.backend.backend()
SUM_RTOL, SUM_ATOL = 1e-9, 1e-12


# The modes each backend's pass uses: XLA fused on an accelerator, stepped on the CPU.
MODES = ("eager",) if BACKEND == "torch" else ("stepped", "fused")


def run_statistics(arrays, divisor=None, scaled=None, mode=MODES[0]):
    """Each array's row of device statistics, grouped and computed as the backend's pass does."""
    scaled = [divisor is not None] * len(arrays) if scaled is None else scaled
    keys = [(a.size, a.dtype.name, s) for a, s in zip(arrays, scaled)]
    groups = device_statistics.chunks(keys)
    one = 1.0 if divisor is None else float(divisor)
    if BACKEND == "jax":
        import jax

        compiled = jax.jit(
            functools.partial(device_statistics.chunk_statistics, groups, scaled, mode=mode)
        )
        with jax.enable_x64(True):
            results = jax.device_get(compiled(arrays, np.float64(one)))
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        from tb_gradviz.capture.backends import tf_statistics

        results = tf_statistics.compiled(groups, scaled, mode)(
            [tf.constant(a) for a in arrays], tf.constant(one, tf.float64)
        )
    else:
        import torch

        results = device_statistics.chunk_statistics(
            groups, scaled, [torch.as_tensor(a) for a in arrays], one, mode=mode
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


@pytest.fixture(params=MODES)
def mode(request, monkeypatch):
    # Steps of 100 values: the loop runs several steps and pads the last one.
    monkeypatch.setattr(device_statistics, "STEP_VALUES", 100)
    return request.param


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("divisor", [None, 1024.0, 3.0])
def test_device_statistics_equal_the_numpy_definition(dtype, divisor, mode):
    rng = np.random.default_rng(5)
    with np.errstate(over="ignore"):  # float16: 3e38 and 1e6 become inf, as intended
        rows = [r.astype(dtype).reshape(4, 9, 9) for r in awkward_rows(rng, 4 * 9 * 9)]
    finite_only = [r for r in rows if np.isfinite(r).all()]
    for group in (rows, finite_only):
        for r, (array, row) in enumerate(zip(group, run_statistics(group, divisor, mode=mode))):
            values = array.astype(np.float64).ravel() / (divisor or 1.0)
            assert_row_is_the_definition(row, values, f"{dtype} / {divisor}, row {r}")


def test_device_counts_equal_the_host_kernel(mode):
    pytest.importorskip("numba")
    from tb_gradviz.capture import kernels

    rng = np.random.default_rng(7)
    rows = awkward_rows(rng, 1000) + [rng.standard_normal(1000).astype(np.float32) * 1e-3]
    for r, (array, row) in enumerate(zip(rows, run_statistics(rows, mode=mode))):
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


def test_tensors_of_many_sizes_and_dtypes_get_their_own_rows(mode):
    rng = np.random.default_rng(2)
    arrays = [
        (rng.standard_normal(shape) * (i + 1)).astype(dtype)
        for i, (shape, dtype) in enumerate(
            [((3, 5), "float32"), ((15,), "float32"), ((7,), "float64"), ((3, 5), "float16")]
            + [((2, 2), "float32")] * 3
        )
    ]
    scaled = [False, True, False, True, False, False, True]
    rows = run_statistics(arrays, 4.0, scaled, mode)
    for i, (array, row, divided) in enumerate(zip(arrays, rows, scaled)):
        values = array.astype(np.float64).ravel() / (4.0 if divided else 1.0)
        assert row["count"] == array.size
        assert_row_is_the_definition(row, values, f"tensor {i}")


def test_groups_hold_at_most_chunk_values_and_one_tensor_at_least(monkeypatch):
    monkeypatch.setattr(device_statistics, "CHUNK_VALUES", 100)
    keys = [(30, "a"), (30, "a"), (30, "a"), (30, "a"), (500, "a"), (30, "b"), (None, "a")]
    assert device_statistics.chunks(keys) == [[0, 1, 2], [3], [4], [5], [6]]


def test_a_mode_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match=r"mode must be one of .*Received: mode='gpu'"):
        device_statistics.group_statistics([keras.ops.ones((4,))], mode="gpu")


FORBIDDEN_HLO = ("scatter", "sort", "custom-call", "custom_call", "gather")
# At most this many top-level instructions (kernels, loops) per group, as XLA compiles them here.
PROGRAM_PER_GROUP = {"fused": 100, "stepped": 100}
FORBIDDEN_TORCH_OPS = (
    "scatter",
    "sort",
    "searchsorted",
    "bincount",
    "histc",
    "index_put",
    "index_add",
)


def compiled_program(sizes, mode):
    """The compiled text of the statistics of float32 tensors of `sizes` (a group per size)."""
    keys = [(n, "float32", False) for n in sizes]
    groups = device_statistics.chunks(keys)
    scaled = [False] * len(sizes)
    if BACKEND == "jax":
        import jax

        compiled = jax.jit(
            functools.partial(device_statistics.chunk_statistics, groups, scaled, mode=mode)
        )
        args = ([jax.ShapeDtypeStruct((n,), "float32") for n in sizes], np.float64(1.0))
        with jax.enable_x64(True):
            lowered = compiled.lower(*args)
            return lowered.as_text() + lowered.compile().as_text()
    import tensorflow as tf

    from tb_gradviz.capture.backends import tf_statistics

    function = tf_statistics.compiled(groups, scaled, mode)
    args = ([tf.zeros([n]) for n in sizes], tf.constant(1.0, tf.float64))
    return function.experimental_get_compiler_ir(*args)(stage="optimized_hlo")


def op_names(text):
    """The operations of an HLO or StableHLO program (not its metadata, which names functions)."""
    hlo = re.findall(r"= \S+ ([a-z][\w-]*)\(", text)
    return set(hlo) | set(re.findall(r"\b(?:stablehlo|chlo|mhlo)\.([a-z_]+)", text))


def top_level_instructions(text):
    """The instructions of the compiled program's entry computation that run (kernels, loops).

    Parameters, constants, bitcasts and tuples run nothing.
    """
    entry = text[text.rindex("ENTRY") :]
    inert = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element"}
    return [
        line
        for line in entry.splitlines()[1:]
        if (m := re.search(r"= \S+ ([a-z][\w-]*)\(", line)) and m.group(1) not in inert
    ]


@pytest.mark.skipif(BACKEND == "torch", reason="PyTorch runs eagerly: the op test below")
@pytest.mark.parametrize("mode", ["fused", "stepped"])
def test_compiled_statistics_hold_no_scatter_sort_or_gather_and_a_fixed_program_per_group(
    mode, monkeypatch
):
    # Stepped: every group below is a loop of several steps of 1024 values.
    monkeypatch.setattr(device_statistics, "STEP_VALUES", 1024)
    one = compiled_program([64 * 64] * 2, mode)
    names = op_names(one)
    assert {"compare", "reduce"} <= names
    for forbidden in FORBIDDEN_HLO:
        assert not any(forbidden in name for name in names), (forbidden, names)
    if mode == "fused":
        assert "while" not in names
    # The program of a group does not grow with its rows, and each group adds the same.
    base = len(top_level_instructions(one))
    # (give or take a few fusions the compiler forms otherwise for another shape).
    many_rows = len(top_level_instructions(compiled_program([64 * 64] * 16, mode)))
    assert abs(many_rows - base) <= 4, (many_rows, base)
    # Each further group adds a bounded program of its own, whatever its size.
    programs = [base]
    for sizes in ([64 * 64, 3000], [64 * 64, 3000, 2000], [64 * 64, 3000, 2000, 50000]):
        programs.append(len(top_level_instructions(compiled_program(sizes * 2, mode))))
    added = np.diff(programs)
    assert np.all((added > 0) & (added <= PROGRAM_PER_GROUP[mode])), programs


@pytest.mark.skipif(BACKEND != "torch", reason="the eager ops of PyTorch's device statistics")
def test_eager_statistics_run_no_scatter_sort_searchsorted_or_bincount_and_a_fixed_op_count():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    def ops_of(rows):
        tensors = [torch.randn(64 * 64) for _ in range(rows)]
        with Ops() as recorded:
            device_statistics.chunk_statistics(
                [list(range(rows))], [True] * rows, tensors, 2.0, "eager"
            )
        return recorded.names

    two, sixteen = ops_of(2), ops_of(16)
    for name in two:
        assert not any(f in name for f in FORBIDDEN_TORCH_OPS), name
    # Beyond one view per tensor to stack it (no kernel), the same ops whatever the rows.
    kernels = [[n for n in names if n != "view.default"] for names in (two, sixteen)]
    assert kernels[0] == kernels[1]


def test_working_memory_of_resnet50_with_all_layers_is_a_small_multiple_of_its_largest_group():
    # JAX's own memory analysis of the compiled statistics, as they run on the CPU.
    if BACKEND != "jax":
        pytest.skip("JAX's compiled.memory_analysis()")
    import jax

    from tb_gradviz.capture import probe, selection

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    model.compile("sgd", "categorical_crossentropy")
    x = np.zeros((2, 32, 32, 3), "float32")
    y = np.eye(10, dtype="float32")[[1, 2]]
    capture = probe.new_capture(
        model, selection.select_layers(model, ["*"]), statistics="device", weights=True
    )
    state = [[v.value for v in vs] for vs in (model.trainable_variables,)]
    state += [
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.metrics_variables],
    ]
    capture._plan(tuple(state), x, y, None, None)  # the plans alone: no pass is compiled
    tensors = [
        jax.ShapeDtypeStruct(tuple(t.shape), t.dtype) for p in capture.plans for t in p.tensors
    ]
    sizes = [int(np.prod(t.shape)) * t.dtype.itemsize for t in tensors]
    groups = device_statistics.chunks([(int(np.prod(t.shape)), t.dtype, False) for t in tensors])
    statistics = jax.jit(
        functools.partial(
            device_statistics.chunk_statistics, groups, [False] * len(tensors), mode="stepped"
        )
    )
    with jax.enable_x64(True):
        compiled = statistics.lower(tensors, np.float64(1.0)).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    largest_group = max(sum(sizes[i] for i in group) for group in groups)
    assert len(tensors) > 900 and len(groups) > 5  # 177 layers with their weights
    assert temp <= 4 * largest_group, (temp, largest_group, sum(sizes))
    assert temp <= sum(sizes) / 4, (temp, largest_group, sum(sizes))
