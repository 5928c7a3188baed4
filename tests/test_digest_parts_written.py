"""The digest in parts (layout 13) on runs written with numpy: the writer's parts, their reading.

A writer fills each part across files and fits and a new writer begins its
own; other records of the digest's plugin stay whole; an earlier writer's
whole digest and later parts, and fits with other layers, are read as the
same runs written whole; parts are joined in step order whatever their
capacity; a plain `tensorboard` keeps every part whole. The real fit is in
`test_digest_parts.py`.
"""

import json

import numpy as np
import pytest
import synthetic
import tbserver
from eventdata import digest_tags, load, plugin_over, tensor_tags, values
from tensorboard import context
from tensorboard.data import provider

from tb_gradviz.board import parts as parts_module
from tb_gradviz.format import digest, digest_parts, events, metadata, records, summaries


def served(root, route, **query):
    gradviz, _ = plugin_over(root)
    return getattr(gradviz, f"{route}_impl")(context.RequestContext(), "", "run", **query)


def pool_events(log, steps, nan_step=None, layers=("a", "b")):
    """Writes two tensors of each of `layers` at `steps`; `b`'s output gradient holds a NaN at
    `nan_step`."""
    for step in steps:
        written = []
        for index, layer in enumerate(layers):
            for role in (records.ACTIVATION, records.OUTPUT_GRADIENT):
                array = np.linspace(-1.0, 1.0, 8) * (1.0 + step / 100)
                if (layer, role, step) == ("b", records.OUTPUT_GRADIENT, nan_step):
                    array[3] = np.nan
                content = {"layer_index": index, "role": role, "index": 0, "shape": [8]}
                written += events.tensor_records(
                    layer,
                    role,
                    summaries.linear_histogram(array),
                    summaries.stats_vector(array),
                    content,
                )
        log.write(step, written)


def bound_to(patch, events_per_part):
    """Sets `PART_BYTES` so that a part of `pool_events`' digests holds `events_per_part`."""
    vector_bytes = 4 * 7 * 4  # four tensor rows of 7 float32 fields
    patch.setattr(
        digest_parts, "PART_BYTES", events_per_part * (vector_bytes + digest_parts.DATUM_BYTES)
    )


def parts_of(logdir):
    """`{tag: [steps]}` of a run's digest series, and its metadata's `part`s."""
    accumulator = load(logdir)
    found = {}
    for tag in digest_tags(accumulator):
        content = metadata.parse_plugin_metadata(
            accumulator.SummaryMetadata(tag).plugin_data.content
        )
        if content["kind"] == metadata.KIND_DIGEST:
            found[tag] = ([step for step, _ in values(accumulator, tag)], content.get("part"))
    return found


def test_a_writer_fills_each_part_across_files_and_a_new_writer_begins_its_own(
    tmp_path, monkeypatch
):
    bound_to(monkeypatch, 3)
    log = events.EventLog(tmp_path)
    pool_events(log, range(1, 5))
    log.close()  # a second fit with the same callback: a new file, the same parts
    pool_events(log, range(5, 9))
    log.close()
    resumed = events.EventLog(tmp_path)  # another process goes on with the run
    pool_events(resumed, range(9, 11))
    resumed.close()
    found = parts_of(tmp_path)
    (series_tag,) = {tag.rsplit("/", 1)[0] for tag in found}
    assert found == {
        f"{series_tag}/1": ([1, 2, 3], {"first_step": 1, "max_events": 3}),
        f"{series_tag}/4": ([4, 5, 6], {"first_step": 4, "max_events": 3}),
        f"{series_tag}/7": ([7, 8], {"first_step": 7, "max_events": 3}),
        f"{series_tag}/9": ([9, 10], {"first_step": 9, "max_events": 3}),
    }
    gradviz, _ = plugin_over(tmp_path)
    ctx = context.RequestContext()
    (joined,) = gradviz._store(ctx, "", ".").digests().values()
    assert [tag for tag, _ in joined.parts] == [f"{series_tag}/{s}" for s in (1, 4, 7, 9)]
    assert gradviz.timeline_impl(ctx, "", ".", width=100)["columns"]["first_step"] == list(
        range(1, 11)
    )


def test_other_records_of_the_digest_plugin_are_not_put_in_parts(tmp_path, monkeypatch):
    bound_to(monkeypatch, 1)
    budget = metadata.create_summary_metadata(
        {"kind": metadata.KIND_BUDGET, "fields": ["share"]}, digest.PLUGIN_NAME
    )
    log = events.EventLog(tmp_path)
    for step in (1, 2):
        log.write(step, [(f"{digest.TAG_PREFIX}/budget", np.array([0.5]), budget)])
    log.close()
    assert tensor_tags(load(tmp_path)) == [f"{digest.TAG_PREFIX}/budget"]


def test_an_earlier_writers_whole_digest_and_later_parts_are_read_as_one_series(
    tmp_path, monkeypatch
):
    bound_to(monkeypatch, 2)
    earlier = events.EventLog(tmp_path / "mixed" / "run", digest_in_parts=False)
    pool_events(earlier, range(1, 5))
    earlier.close()
    later = events.EventLog(tmp_path / "mixed" / "run")
    pool_events(later, range(5, 11), nan_step=8)
    later.close()
    whole = events.EventLog(tmp_path / "whole" / "run", digest_in_parts=False)
    pool_events(whole, range(1, 11), nan_step=8)
    whole.close()
    found = parts_of(tmp_path / "mixed" / "run")
    (series_tag,) = [tag for tag, (_, part) in found.items() if part is None]
    assert found == {
        series_tag: ([1, 2, 3, 4], None),
        **{
            f"{series_tag}/{first}": ([first, first + 1], {"first_step": first, "max_events": 2})
            for first in (5, 7, 9)
        },
    }
    for route, query in (
        ("onset", {}),
        ("timeline", {"width": 4}),
        ("timeline", {"start": 3, "end": 6}),
    ):
        mixed = served(tmp_path / "mixed", route, **query)
        assert json.dumps(mixed, sort_keys=True) == json.dumps(
            served(tmp_path / "whole", route, **query), sort_keys=True
        )
    onsets = {o["flag"]: o for o in served(tmp_path / "mixed", "onset")["onsets"]}
    assert onsets["nonfinite"]["step"] == 8


def test_the_synthetic_large_run_writes_its_digest_in_parts_as_the_callback_does(
    tmp_path, monkeypatch
):
    def write(name):
        synthetic.write_large_run(
            tmp_path / name / "run", layers=2, steps=30, wall_time=0, layer_spike=(23, 0, 1e6)
        )

    write("one")
    monkeypatch.setattr(digest_parts, "PART_BYTES", 10 * (2 * 3 * 28 + digest_parts.DATUM_BYTES))
    write("parts")
    found = parts_of(tmp_path / "parts" / "run")
    assert sorted(part["first_step"] for _, part in found.values()) == [1, 11, 21]
    assert sorted(len(steps) for steps, _ in found.values()) == [10, 10, 10]
    onset = served(tmp_path / "parts", "onset")
    assert json.dumps(onset) == json.dumps(served(tmp_path / "one", "onset"))
    assert [(o["flag"], o["step"]) for o in onset["onsets"]] == [("exploding", 23)]


def test_fits_with_other_layers_keep_their_own_series_each_in_its_parts(tmp_path, monkeypatch):
    # Issue 29: another selection of layers in the same run makes other rows, another series.
    bound_to(monkeypatch, 2)
    for name, in_parts in (("parts", True), ("whole", False)):
        for steps, layers in ((range(1, 6), ("a", "b")), (range(6, 11), ("b",))):
            log = events.EventLog(tmp_path / name / "run", digest_in_parts=in_parts)
            pool_events(log, steps, nan_step=8, layers=layers)
            log.close()
    gradviz, _ = plugin_over(tmp_path / "parts")
    found = gradviz._store(context.RequestContext(), "", "run").digests()
    assert sorted(len(series.parts) for series in found.values()) == [3, 3]
    for route in ("onset", "timeline"):
        texts = [
            json.dumps(served(tmp_path / n, route), sort_keys=True) for n in ("parts", "whole")
        ]
        assert texts[0] == texts[1]
    body = served(tmp_path / "parts", "timeline")
    assert body["steps"] == 10 and [layer["layer"] for layer in body["layers"]] == ["a", "b"]
    onsets = {o["flag"]: o for o in served(tmp_path / "parts", "onset")["onsets"]}
    assert (onsets["nonfinite"]["step"], onsets["nonfinite"]["layer"]) == (8, "b")


def datum(step, value):
    return provider.TensorDatum(
        step=step, wall_time=float(step), numpy=np.full(2, value, np.float32)
    )


@pytest.mark.parametrize("capacity", [None, 2, 5, 100])
def test_parts_are_joined_in_step_order_and_a_step_in_two_parts_keeps_their_order(capacity):
    layout = records.Layout("pair", (2,), lambda values: values[:, :1])
    parts = [[datum(5, 50.0), datum(6, 60.0)], [datum(1, 10.0), datum(2, 20.0)], [datum(6, 61.0)]]
    left_out = []
    joined = parts_module.joined(
        iter(parts + [[datum(3, -1.0)]]), layout, capacity, lambda *e: left_out.append(e)
    )
    assert joined.steps.tolist() == [1, 2, 5, 6, 6]
    assert joined.values[:, 0].tolist() == [10.0, 20.0, 50.0, 60.0, 61.0]
    assert joined.wall_times.tolist() == [1.0, 2.0, 5.0, 6.0, 6.0]
    # A negative count is malformed: left out, and said so, as `decode_series` does.
    assert left_out == [([3], "their pair record counts are not all finite and non-negative")]


def test_a_part_holds_at_most_part_bytes():
    assert digest_parts.PART_BYTES == 32 << 20
    # All ResNet50 layers: ~34 KB per event, 985 events (33.6 MB of vectors) in a part.
    assert digest_parts.events_per_part(34_000) == (32 << 20) // (34_000 + 64) == 985
    assert digest_parts.events_per_part(10**9) == 1


def test_a_part_of_malformed_metadata_is_skipped_with_a_warning(tmp_path, caplog):
    rows = [["tensor", "a", "activation"]]
    bad = metadata.create_summary_metadata(
        {"kind": "digest", "rows": rows, "part": {"first_step": "one", "max_events": 3}},
        digest.PLUGIN_NAME,
    )
    log = events.EventLog(tmp_path, with_digest=False)
    log.write(1, [(f"{digest.digest_tag(rows)}/1", np.zeros(7, np.float32), bad)])
    log.close()
    gradviz, _ = plugin_over(tmp_path)
    assert gradviz._store(context.RequestContext(), "", ".").digests() == {}
    assert "metadata tb_gradviz cannot read" in caplog.text


def onset_when_loaded(url, steps):
    try:
        body = tbserver.get_json(f"{url}/data/plugin/gradviz/onset?run=run")
    except OSError:
        return None
    return body if body["last_step"] == steps else None


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", ("false", "true"))
def test_plain_tensorboard_keeps_every_part_whole_and_names_a_nan_in_the_last_part(
    tmp_path, monkeypatch, load_fast
):
    # 150 events in parts of 60: TensorBoard samples each part as a series of its own, and
    # the loader's default for the digest's plugin keeps each one whole.
    bound_to(monkeypatch, 60)
    log = events.EventLog(tmp_path / "logs" / "run")
    pool_events(log, range(1, 151), nan_step=137)
    log.close()
    parts = sorted(part["first_step"] for _, part in parts_of(tmp_path / "logs" / "run").values())
    assert parts == [1, 61, 121]
    with tbserver.running_tensorboard(
        tmp_path / "logs",
        tmp_path / "tensorboard.log",
        ready=lambda url: onset_when_loaded(url, 150) is not None,
        extra_args=(f"--load_fast={load_fast}",),
        samples=(),
    ) as url:
        body = onset_when_loaded(url, 150)
    assert (body["steps"], body["first_step"]) == (150, 1)
    (nonfinite,) = body["onsets"]
    assert (nonfinite["flag"], nonfinite["step"], nonfinite["layer"]) == ("nonfinite", 137, "b")
