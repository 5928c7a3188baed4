"""The device statistics (`capture.device_statistics`) on the Keras backend in use.

Run as each backend's pass runs them: jitted on JAX, XLA-compiled on
TensorFlow (`tf_statistics.compiled`), eagerly on PyTorch. Checked against
the numpy definition (`format.summaries`) and the host kernel: counts, extrema,
histogram edges and the precision record bit for bit (the precision record
also against ml_dtypes' casts), the summed fields (mean, std, sum, the
routing sums) to float64 rounding (`SUM_RTOL`, and `SUM_ATOL` times the sum
of magnitudes for rows that cancel). Like tests/test_backends.py, this file
is meant to run under every KERAS_BACKEND.
"""

import collections
import contextlib
import functools
import re

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import eventdata  # noqa: E402
from test_precision_record import edge_values, recorded, reference  # noqa: E402
from values import awkward_rows  # noqa: E402

from tb_gradviz.capture import assemble, device_packing, device_statistics  # noqa: E402
from tb_gradviz.format import records, summaries  # noqa: E402

BACKEND = keras.backend.backend()
SUM_RTOL, SUM_ATOL = 1e-9, 1e-12


# The modes each backend's pass uses: XLA fused on an accelerator, stepped on the CPU.
MODES = ("eager",) if BACKEND == "torch" else ("stepped", "fused")


def run_statistics(arrays, divisor=None, scaled=None, mode=MODES[0], precision=True):
    """Each array's row of device statistics, grouped and computed as the backend's pass does."""
    scaled = [divisor is not None] * len(arrays) if scaled is None else scaled
    keys = [(a.size, a.dtype.name, s) for a, s in zip(arrays, scaled)]
    groups = device_statistics.chunks(keys)
    one = 1.0 if divisor is None else float(divisor)
    if BACKEND == "jax":
        import jax

        compiled = jax.jit(
            functools.partial(
                device_statistics.chunk_statistics, groups, scaled, mode=mode, precision=precision
            )
        )
        with jax.enable_x64(True):
            results = jax.device_get(compiled(arrays, np.float64(one)))
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        from tb_gradviz.capture.backends import tf_statistics

        compiled = tf_statistics.compiled(groups, scaled, mode)
        if not precision:
            compiled = tf.function(
                functools.partial(
                    device_statistics.chunk_statistics, groups, scaled, mode=mode, precision=False
                ),
                jit_compile=True,
            )
        results = compiled([tf.constant(a) for a in arrays], tf.constant(one, tf.float64))
    else:
        import torch

        def tensor(a):  # PyTorch takes no ml_dtypes array: bfloat16 goes through float32
            if a.dtype.name == "bfloat16":
                return torch.as_tensor(a.astype(np.float32)).to(torch.bfloat16)
            return torch.as_tensor(a)

        results = device_statistics.chunk_statistics(
            groups, scaled, [tensor(a) for a in arrays], one, mode=mode, precision=precision
        )
    return device_statistics.tensor_rows(groups, results, [a.size for a in arrays])


def assert_row_is_the_definition(row, values, err_msg, captured=None):
    """The row's records are those of `values`; its precision record that of `captured` (the
    values before the loss scale divided them), when given."""
    histogram, stats, precision = assemble.summary_of_row(row)
    if captured is not None:
        np.testing.assert_array_equal(
            precision, summaries.precision_vector(captured), err_msg=err_msg
        )
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
            captured = array.astype(np.float64).ravel()
            values = captured / (divisor or 1.0)
            assert_row_is_the_definition(row, values, f"{dtype} / {divisor}, row {r}", captured)


def test_device_counts_equal_the_host_kernel(mode):
    pytest.importorskip("numba")
    from tb_gradviz.capture import kernels

    rng = np.random.default_rng(7)
    rows = awkward_rows(rng, 1000) + [rng.standard_normal(1000).astype(np.float32) * 1e-3]
    for r, (array, row) in enumerate(zip(rows, run_statistics(rows, mode=mode))):
        histogram, stats, precision = assemble.summary_of_row(row)
        host_histogram, host_stats, host_precision = kernels.summary(array, precision=True)
        np.testing.assert_array_equal(precision, host_precision, err_msg=f"row {r}")
        exact = np.ones(records.STATS_LENGTH, bool)
        exact[records.SUMMED_STATS] = False
        np.testing.assert_array_equal(stats[exact], host_stats[exact], err_msg=f"row {r}")
        np.testing.assert_array_equal(histogram, host_histogram, err_msg=f"row {r}")
        # Rows that cancel (+-3e38) are judged against their sum of magnitudes.
        scale = np.abs(array[np.isfinite(array)].astype(np.float64)).sum()
        np.testing.assert_allclose(
            stats[~exact], host_stats[~exact], rtol=SUM_RTOL, atol=SUM_ATOL * scale
        )


def specials(dtype):
    """Zeros, NaN, Inf, 1 and 2, and a subnormal between (1e-40 in float32), the smallest normal,
    the largest and the smallest subnormal of `dtype`: each of both signs."""
    import ml_dtypes

    as_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    info = ml_dtypes.finfo(as_dtype)
    tiny, smallest = float(info.smallest_normal), float(info.smallest_subnormal)
    largest = tiny - smallest  # the largest subnormal, exactly
    between = 1e-40 if dtype == "float32" else tiny * 2.0**-5
    magnitudes = [between, 1.0, 2.0, tiny, largest, smallest]
    values = [v for m in magnitudes for v in (-m, m)] + [0.0, -0.0, np.inf, -np.inf]
    values += [np.nan, -np.nan]  # NaN with the sign bit set too
    array = np.array(values, np.float64).astype(as_dtype)
    assert np.count_nonzero(array.astype(np.float64) == 0) == 2  # +-0.0: no subnormal is 0
    return array


# What `summaries.stats_vector` records of float32's or float64's `specials`: 2 zeros, 2 NaN,
# +Inf and -Inf, and in each sign's magnitude bins 1 and 2 in bin 25 ([1, 3.16)), the four tiny
# values in bin 0 (below 1e-12).
SPECIAL_COUNTS = {"count": 18, "zeros": 2, "nan": 2, "pos_inf": 1, "neg_inf": 1}
SPECIAL_BINS = {0: 4, 25: 2}


def assert_counts_of_specials(stats, err_msg=""):
    record = records.decode_stats(stats)
    assert {k: record[k] for k in SPECIAL_COUNTS} == SPECIAL_COUNTS, err_msg
    for side in ("negative", "positive"):
        bins = dict((j, c) for j, c in enumerate(record["log_counts"][side]) if c)
        assert bins == SPECIAL_BINS, (err_msg, side, bins)


@pytest.fixture(
    params=[False, True] if BACKEND == "torch" else [False],
    ids=lambda flushed: "flushing" if flushed else "as-is",
)
def flushing(request):
    """Whether the statistics run with subnormals flushed to zero, as XLA runs on the CPU: on
    PyTorch, whose CPU kernels keep them, once as they are and once flushed
    (`torch.set_flush_denormal`, around the statistics only: numpy's reference is not flushed)."""
    if not request.param:
        return contextlib.nullcontext
    import torch

    @contextlib.contextmanager
    def flushed():
        assert torch.set_flush_denormal(True)
        try:
            yield
        finally:
            torch.set_flush_denormal(False)

    return flushed


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_device_subnormals_zeros_nan_and_inf_are_counted_as_on_the_host(dtype, mode, flushing):
    """Every count of each sign's subnormals, zeros, NaN and Inf, the extrema and the histogram
    equal the definition's and the host kernel's, also on a device that flushes subnormals to
    zero (XLA on the CPU), with and without a loss scale."""
    pytest.importorskip("numba")
    from tb_gradviz.capture import kernels

    arrays = [specials(dtype)]
    if dtype == "float32":  # no zeros: one value in each sign's magnitude bin 0
        arrays.append(np.array([-1e-40, 1e-40, -1, 2], np.float32))
    for divisor in (None, 1024.0):
        with flushing():
            rows = run_statistics(arrays, divisor, mode=mode)
        for r, (array, row) in enumerate(zip(arrays, rows)):
            captured = array.astype(np.float64)
            message = f"{dtype} / {divisor}, row {r}"
            assert_row_is_the_definition(row, captured / (divisor or 1.0), message, captured)
            host = kernels.summary(assemble.host_array(array), divisor, precision=True)
            for record, expected in zip(assemble.summary_of_row(row), host):
                exact = np.ones(expected.shape[-1], bool)
                if expected.shape == (records.STATS_LENGTH,):
                    exact[records.SUMMED_STATS] = False
                np.testing.assert_array_equal(record[..., exact], expected[..., exact], message)
        if dtype == "float32" and divisor is None:
            assert_counts_of_specials(assemble.summary_of_row(rows[0])[1])
            record = records.decode_stats(assemble.summary_of_row(rows[1])[1])
            assert record["zeros"] == 0
            assert [record["log_counts"][s][0] for s in ("negative", "positive")] == [1, 1]


def test_device_counts_of_float64_subnormals_equal_the_host(mode, flushing):
    """float64 subnormals too: each count compares bits where a flushing device's comparison
    would see 0 (the extrema and sums are the device's float64 arithmetic, docs/FORMAT.md)."""
    array = specials("float64")
    with flushing():
        (row,) = run_statistics([array], mode=mode)
    stats = assemble.summary_of_row(row)[1]
    assert_counts_of_specials(stats)
    counts = np.r_[records.STAT_COUNT : records.STAT_NEG_INF + 1, records.NEGATIVE_BINS.start :]
    expected = summaries.stats_vector(array)
    np.testing.assert_array_equal(stats[counts], expected[counts])


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
        captured = array.astype(np.float64).ravel()
        values = captured / (4.0 if divided else 1.0)
        assert row["count"] == array.size
        assert_row_is_the_definition(row, values, f"tensor {i}", captured)


def precision_rows():
    """float32 rows for the precision record: every format's rounding edges (signed zeros, NaN,
    Inf), values across float32's range (subnormals included) and exact powers of two, each
    also scaled by powers of two that move every boundary into another part of the range."""
    rng = np.random.default_rng(1)
    spread = np.sign(rng.normal(size=1000)) * 2.0 ** rng.uniform(-149, 127, 1000)
    powers = 2.0 ** rng.integers(-149, 127, 400)
    rows = []
    for base in (edge_values().astype(np.float64), spread, powers):
        for scale in (1.0, 2.0**-100, 2.0**60, 2.0**-130):
            with np.errstate(over="ignore", under="ignore"):
                rows.append((base * scale).astype(np.float32))
    finite = edge_values()[np.isfinite(edge_values())]
    rows += [finite, np.zeros(50, np.float32), np.full(50, np.nan, np.float32)]
    return rows


def test_device_precision_records_equal_the_definition_and_ml_dtypes_casts(mode):
    """Bit for bit, at every format's rounding edges (half the smallest subnormal rounds to zero)
    and across float32's range, subnormals included: the counts compare bits, which a device that
    flushes subnormals to zero does not flush."""
    rows = precision_rows()
    for r, (array, row) in enumerate(zip(rows, run_statistics(rows, mode=mode))):
        precision = assemble.summary_of_row(row)[2]
        np.testing.assert_array_equal(
            precision, summaries.precision_vector(array), err_msg=f"row {r}"
        )
        assert recorded(precision) == reference(array), f"row {r}"


def test_device_precision_records_equal_the_host_kernels():
    pytest.importorskip("numba")
    from tb_gradviz.capture import kernels

    rows = precision_rows()
    for r, (array, row) in enumerate(zip(rows, run_statistics(rows))):
        np.testing.assert_array_equal(
            assemble.summary_of_row(row)[2],
            kernels.summary(array, precision=True)[2],
            err_msg=f"row {r}",
        )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_device_precision_records_of_other_dtypes_equal_the_definition(dtype, mode):
    """float16 and bfloat16 (whose subnormals are float32 subnormals) widen exactly; float64 is
    compared in its own bits."""
    import ml_dtypes

    as_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(2)
    with np.errstate(over="ignore", under="ignore"):
        rows = [
            edge_values().astype(as_dtype),
            (np.sign(rng.normal(size=500)) * 2.0 ** rng.uniform(-140, 127, 500)).astype(as_dtype),
            (rng.standard_normal(500) * 1e-3).astype(as_dtype),
        ]
    for r, (array, row) in enumerate(zip(rows, run_statistics(rows, mode=mode))):
        np.testing.assert_array_equal(
            assemble.summary_of_row(row)[2],
            summaries.precision_vector(array.astype(np.float64)),
            err_msg=f"{dtype} row {r}",
        )


def test_device_precision_records_see_the_values_before_the_loss_scale():
    """The divisor divides the stats' values, never the precision record's: under mixed_float16
    the float16 counts are what the scaled backward pass holds."""
    rows = [edge_values(), np.float32(2.0**-20) * np.arange(1, 65, dtype=np.float32)]
    for array, row in zip(rows, run_statistics(rows, divisor=2.0**15)):
        np.testing.assert_array_equal(
            assemble.summary_of_row(row)[2], summaries.precision_vector(array)
        )


def test_statistics_without_the_precision_record_are_the_same_without_its_counts():
    arrays = [np.linspace(-3, 3, 64, dtype=np.float32)]
    (row,) = run_statistics(arrays, precision=False)
    assert not any(name.startswith("precision") for name in row)
    (full,) = run_statistics(arrays)
    assert len(assemble.summary_of_row(row)) == 2
    for record, expected in zip(assemble.summary_of_row(row), assemble.summary_of_row(full)):
        np.testing.assert_array_equal(record, expected)


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

    # One program per distinct group (`GroupPrograms`): compiled as one here, all groups
    # inlined, to read what the groups' programs hold together.
    function = tf.function(tf_statistics.compiled(groups, scaled, mode), jit_compile=True)
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

    counted = {rows: collections.Counter(ops_of(rows)) for rows in (2, 4, 16)}
    for name in counted[16]:
        assert not any(f in name for f in FORBIDDEN_TORCH_OPS), name
    # Packing a tensor into the chunk takes a few ops, one of each kind (its view, its
    # padding, its mask), the same for every tensor; the chunk's statistics are the same ops
    # whatever the number of tensors in it.
    per_tensor = counted[16] - counted[2]
    assert len(per_tensor) <= 6 and set(per_tensor.values()) == {14}
    assert counted[4] - counted[2] == collections.Counter({name: 2 for name in per_tensor})
    assert not counted[2] - counted[16]


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
    # As the pass runs them (`device_programs.GroupPrograms`): each chunk packed into a buffer,
    # then summarised by its compiled program; one chunk at a time.
    order = [i for group in groups for i in group]
    chunked = device_packing.layout(
        [int(np.prod(tensors[i].shape)) for i in order],
        [str(tensors[i].dtype) for i in order],
        [False] * len(order),
        None,
        device_statistics.CHUNK_VALUES,
    )
    held = {}
    for chunk in chunked:
        if chunk.key in held:
            continue
        program = jax.jit(
            functools.partial(
                device_statistics.packed_statistics,
                slots=chunk.slots,
                mode="stepped",
                precision=True,
                blocks=False,
            )
        )
        buffer = jax.ShapeDtypeStruct((chunk.rows, device_packing.ROW_VALUES), chunk.dtype)
        data = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in chunk.data.items()}
        with jax.enable_x64(True):
            compiled = program.lower(buffer, data, np.float64(1.0)).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes
        held[chunk.key] = chunk.rows * device_packing.ROW_VALUES * 4 + temp
    temp = max(held.values())
    largest_group = max(sum(sizes[i] for i in group) for group in groups)
    assert len(tensors) > 900 and len(groups) > 5  # 177 layers with their weights
    assert temp <= 4 * largest_group, (temp, largest_group, sum(sizes))
    assert temp <= sum(sizes) / 4, (temp, largest_group, sum(sizes))


def test_float32_subnormals_through_a_reshape_are_recorded_as_on_the_host():
    """A tensor of each sign's subnormals beside zeros, NaN and Inf, captured with
    statistics="device": every record equals the host's, and no magnitude bin is negative (the
    reader leaves such a row out)."""
    from tb_gradviz.capture import probe, selection

    values = specials("float32")
    model = keras.Sequential([keras.Input((values.size,)), keras.layers.Reshape((6, 3))])
    model.compile("sgd", "mse")
    x, y = values[None, :], np.zeros((1, 6, 3), np.float32)
    chosen = selection.select_layers(model, ["reshape*"])
    host, _ = probe.new_capture(model, chosen, statistics="host").run(x, y)
    device, _ = probe.new_capture(model, chosen, statistics="device").run(x, y)
    assert [tag for tag, _, _ in host] == [tag for tag, _, _ in device]
    kinds = {tag.rsplit("/", 1)[1] for tag, _, _ in device}
    assert {"stats", "precision"} <= kinds, kinds
    summed = np.zeros(records.STATS_LENGTH, bool)
    summed[records.SUMMED_STATS] = True
    for (tag, expected, _), (_, record, _) in zip(host, device):
        if tag.endswith("/stats"):
            np.testing.assert_array_equal(record[~summed], expected[~summed], err_msg=tag)
            np.testing.assert_allclose(record[summed], expected[summed], rtol=SUM_RTOL, err_msg=tag)
            assert np.all(record[records.NEGATIVE_BINS.start :] >= 0), tag
        elif tag.endswith("/routing"):
            np.testing.assert_allclose(record, expected, rtol=SUM_RTOL, err_msg=tag)
        elif tag.endswith("/precision"):
            assert len(record) == records.PRECISION_LENGTH, tag  # with the block part
            eventdata.assert_same_precision(expected, record, tag)
        else:
            np.testing.assert_array_equal(record, expected, err_msg=tag)
    (activation,) = [r for tag, r, _ in device if tag.endswith("activation/stats")]
    assert_counts_of_specials(activation)
