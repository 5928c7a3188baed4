"""`synthetic.write_large_run` and `format.EventFile`: the real event-file format, checked by TensorBoard's own readers."""

import numpy as np
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

import eventdata
from tb_gradviz import format as fmt
from tb_gradviz import synthetic


def test_record_checksums_match_tensorboards():
    rng = np.random.default_rng(0)
    messages = [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in (0, 1, 4, 5, 8, 31, 300, 1000)]
    messages.append(b"\x00" * 40)
    assert [fmt.masked_crc32c(m) for m in messages] == [masked_crc32c(m) for m in messages]


def test_large_run_reads_back_with_metadata_and_every_step(tmp_path):
    names, path = synthetic.write_large_run(tmp_path / "run", layers=3, steps=7, variants=2, first_step=10,
                                            wall_time=1000.0)
    accumulator = eventdata.load(tmp_path / "run")
    assert eventdata.layers(accumulator) == names
    for name in names:
        for tensor in fmt.ROLES:
            stats = eventdata.values(accumulator, fmt.stats_tag(name, tensor))
            assert [step for step, _ in stats] == list(range(10, 17))
            # Variants alternate: steps 10, 12, ... hold the same record.
            np.testing.assert_array_equal(stats[0][1], stats[2][1])
            assert fmt.decode_stats(stats[0][1])["count"] == (512 if tensor == fmt.INPUT_GRADIENT else 128)
        assert eventdata.content(accumulator, fmt.stats_tag(name, "activation"))["layer"] == name
        assert [step for step, _ in eventdata.values(accumulator, fmt.routing_tag(name))] == list(range(10, 17))
