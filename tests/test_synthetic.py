"""`synthetic.write_large_run` and `events.EventFile`: the real event-file format.

Checked by TensorBoard's own readers.
"""

import itertools

import eventdata
import numpy as np
import synthetic
from tensorboard.backend.event_processing import event_file_loader, plugin_event_multiplexer
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from tb_gradviz.format import events, records


def test_record_checksums_match_tensorboards():
    rng = np.random.default_rng(0)
    messages = [
        rng.integers(0, 256, size=n, dtype=np.uint8).tobytes()
        for n in (0, 1, 4, 5, 8, 31, 300, 1000)
    ]
    messages.append(b"\x00" * 40)
    assert [events.masked_crc32c(m) for m in messages] == [masked_crc32c(m) for m in messages]


def test_large_run_reads_back_with_metadata_and_every_step(tmp_path):
    names, path = synthetic.write_large_run(
        tmp_path / "run", layers=3, steps=7, variants=2, first_step=10, wall_time=1000.0
    )
    accumulator = eventdata.load(tmp_path / "run")
    assert eventdata.layers(accumulator) == names
    for name in names:
        for tensor in records.TENSOR_ROLES:
            stats = eventdata.values(accumulator, records.stats_tag(name, tensor))
            assert [step for step, _ in stats] == list(range(10, 17))
            # Variants alternate: steps 10, 12, ... hold the same record.
            np.testing.assert_array_equal(stats[0][1], stats[2][1])
            assert records.decode_stats(stats[0][1])["count"] == (
                512 if tensor == records.INPUT_GRADIENT else 128
            )
        assert (
            eventdata.content(accumulator, records.stats_tag(name, "activation"))["layer"] == name
        )
        assert [
            step for step, _ in eventdata.values(accumulator, records.routing_tag(name))
        ] == list(range(10, 17))


def reference_max_pool_2x2(inputs, output_gradient):
    """Window by window: the first maximum in raster order gets the window's gradient."""
    b, h, w, c = inputs.shape
    outputs = np.zeros((b, h // 2, w // 2, c))
    input_gradient = np.zeros(inputs.shape)
    routed, tied = set(), 0
    for n, i, j, k in np.ndindex(outputs.shape):
        window = [(2 * i + di, 2 * j + dj) for di in range(2) for dj in range(2)]
        values = [inputs[n, r, q, k] for r, q in window]
        best = max(values)
        r, q = window[values.index(best)]
        outputs[n, i, j, k] = best
        input_gradient[n, r, q, k] += output_gradient[n, i, j, k]
        routed.add((n, r, q, k))
        tied += values.count(best) > 1
    return outputs, input_gradient, len(routed), tied


def test_synthetic_routing_is_counted_from_the_pooled_arrays():
    # Defect 6: routing was hard-coded (routed = windows, no ties) whatever the data.
    inputs, output_gradient = synthetic.pool_arrays(
        np.random.default_rng(3), batch=2, size=8, channels=4
    )
    inputs[0, :2, :2, 0] = 0.0  # a whole window of ReLU zeros: a tie
    outputs, input_gradient, routing = synthetic.max_pool_2x2(inputs, output_gradient)
    want_outputs, want_gradient, want_routed, want_tied = reference_max_pool_2x2(
        inputs, output_gradient
    )
    np.testing.assert_array_equal(outputs, want_outputs)
    np.testing.assert_array_equal(input_gradient, want_gradient)
    decoded = records.decode_routing(routing)
    assert decoded["routed_positions"] == want_routed == 128
    assert decoded["tied_windows"] == want_tied
    assert want_tied >= 1
    assert decoded["input_positions"] == 512 and decoded["windows"] == 128
    assert decoded["output_gradient_abs_sum"] == np.abs(output_gradient.astype(np.float64)).sum()


def test_synthetic_runs_write_one_event_per_step_as_the_callback_does(tmp_path):
    # Defect 6: one event per (step, layer) was a file layout the callback never writes.
    synthetic.write_run(tmp_path / "small", layers=3, steps=4)
    synthetic.write_large_run(tmp_path / "large", layers=3, steps=5, variants=2)
    for run, steps in (("small", 4), ("large", 5)):
        (path,) = (tmp_path / run).iterdir()
        loaded = list(event_file_loader.EventFileLoader(str(path)).Load())
        assert [event.HasField("summary") for event in loaded] == [False] + [True] * steps
        # Per layer 3 tensors x 2 records and routing; then the digest.
        assert {len(event.summary.value) for event in loaded[1:]} == {3 * (2 * 3 + 1) + 1}


def test_a_tenth_event_file_in_a_second_is_read_after_the_ninth(tmp_path, monkeypatch):
    # TensorBoard read a process's file "...9.gradviz", then skipped "...10.gradviz",
    # created later in the same second but named before it.
    monkeypatch.setattr(events, "_file_numbers", itertools.count(9))
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"gradviz": 0})
    for step in (1, 2):
        log = events.EventLog(tmp_path / "run")
        log.write(
            step, synthetic.pool_records(np.random.default_rng(step), "pool", 0), wall_time=1000.0
        )
        log.close()
        multiplexer.AddRunsFromDirectory(str(tmp_path))  # as TensorBoard's reload does
        multiplexer.Reload()
    assert [
        event.step for event in multiplexer.Tensors("run", records.stats_tag("pool", "activation"))
    ] == [1, 2]
