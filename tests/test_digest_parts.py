"""The digest written in parts (layout 13) and read back joined: no size cliff (issue 30, item 3).

A real fit whose digest spans several parts (a tiny `digest_parts.PART_BYTES`)
serves the `/onset`, `/timeline` and `check` of the same run written as one
part and as one series under the rows' tag (before layout 13); a NaN in a
later part is named at its true step; each part is read in a request of its
own. The writer's parts, a run continued by another writer and an earlier
writer's digest joined with later parts are checked on written runs.
"""

import json

import numpy as np
import pytest
import synthetic
import tbserver
import test_full_records
import test_onset
from eventdata import load, plugin_over, tensor_tags, values
from tensorboard import context
from tensorboard.data import provider
from tensorboard.util import tensor_util

from tb_gradviz.board import parts as parts_module
from tb_gradviz.format import digest, digest_parts, events, metadata, records, summaries

keras = pytest.importorskip("keras")

STEPS = 24
NAN_STEP = 17
EVENTS_PER_PART = 5
# The parts' first steps: NAN_STEP is in the fourth of five.
FIRST_STEPS = [1, 6, 11, 16, 21]
LAYERS = ["d1", "scale", "d2", "logits"]
# Full records at the first 6 events, then thinning (and at the onset and the step before):
# most steps have their digest alone.
FULL_FIRST = 6
FULL_STEPS = [1, 2, 3, 4, 5, 6, 7, 9, 12, 16, 17, 21]


def fit(logdir, steps):
    """test_onset's dense network, `steps` steps logged at each (full records thinned); the
    `scale` layer's factor becomes NaN at NAN_STEP."""
    from tb_gradviz import GradVizCallback

    keras.utils.set_random_seed(0)
    scale = test_onset.Scale(name="scale")
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="tanh", name="d1"),
            scale,
            keras.layers.Dense(8, activation="tanh", name="d2"),
            keras.layers.Dense(3, name="logits"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * steps, 6)).astype("float32")
    y = rng.normal(size=(4 * steps, 3)).astype("float32")
    callbacks = [
        test_onset.SetFactorAt(scale, NAN_STEP, float("nan")),
        GradVizCallback(
            logdir, (x[:8], y[:8]), layers=LAYERS, every_n_batches=1, full_records=FULL_FIRST
        ),
    ]
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)


def digest_tags(accumulator):
    return [tag for tag in tensor_tags(accumulator) if tag.startswith(digest.TAG_PREFIX + "/")]


def rewrite(source, target, in_parts):
    """Writes the run at `source` again, event by event (steps and wall times kept), with its
    digest joined into one series: one part (`in_parts`) or the rows' tag alone, as before
    layout 13."""
    accumulator = load(source)
    by_step = {}
    for tag in tensor_tags(accumulator):
        written, summary_metadata = tag, accumulator.SummaryMetadata(tag)
        if summary_metadata.plugin_data.plugin_name == digest.PLUGIN_NAME:
            content = metadata.parse_plugin_metadata(summary_metadata.plugin_data.content)
            written = digest.digest_tag(content["rows"])
            summary_metadata = metadata.create_summary_metadata(
                {"kind": metadata.KIND_DIGEST, "rows": content["rows"]}, digest.PLUGIN_NAME
            )
        for event in accumulator.Tensors(tag):
            array = tensor_util.make_ndarray(event.tensor_proto)
            by_step.setdefault(event.step, (event.wall_time, []))[1].append(
                (written, array, summary_metadata)
            )
    log = events.EventLog(target, digest_in_parts=in_parts)
    for step in sorted(by_step):
        wall_time, written = by_step[step]
        log.write(step, written, wall_time=wall_time, add_digest=False)
    log.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    # One step first, to learn the bytes of one event's digest.
    fit(root / "probe", 1)
    ((_, vector),) = values(load(root / "probe"), digest_tags(load(root / "probe"))[0])
    with pytest.MonkeyPatch.context() as patch:
        part_bytes = EVENTS_PER_PART * (vector.nbytes + digest_parts.DATUM_BYTES)
        patch.setattr(digest_parts, "PART_BYTES", part_bytes)
        fit(root / "parts" / "run", STEPS)
    rewrite(root / "parts" / "run", root / "one" / "run", in_parts=True)
    rewrite(root / "parts" / "run", root / "whole" / "run", in_parts=False)
    return root


def served(root, route, **query):
    gradviz, _ = plugin_over(root)
    return getattr(gradviz, f"{route}_impl")(context.RequestContext(), "", "run", **query)


def test_the_fit_wrote_its_digest_in_parts_of_a_bounded_number_of_events(runs):
    accumulator = load(runs / "parts" / "run")
    tags = digest_tags(accumulator)
    contents = [
        metadata.parse_plugin_metadata(accumulator.SummaryMetadata(t).plugin_data.content)
        for t in tags
    ]
    (series_tag,) = {digest.digest_tag(c["rows"]) for c in contents}
    by_first = sorted(zip((c["part"]["first_step"] for c in contents), tags))
    assert [first for first, _ in by_first] == FIRST_STEPS
    for first, tag in by_first:
        assert tag == f"{series_tag}/{first}"
        steps = [step for step, _ in values(accumulator, tag)]
        assert steps == list(range(first, min(first + EVENTS_PER_PART, STEPS + 1)))
    assert {c["part"]["max_events"] for c in contents} == {EVENTS_PER_PART}
    # Rewritten: one part from step 1, and the rows' own tag.
    assert digest_tags(load(runs / "one" / "run")) == [f"{series_tag}/1"]
    assert digest_tags(load(runs / "whole" / "run")) == [series_tag]


def test_onset_is_the_same_in_parts_in_one_part_and_whole_and_the_nan_is_at_its_step(runs):
    bodies = {name: served(runs / name, "onset") for name in ("parts", "one", "whole")}
    texts = {name: json.dumps(body, sort_keys=True) for name, body in bodies.items()}
    assert texts["parts"] == texts["one"] == texts["whole"]
    assert bodies["parts"]["steps"] == STEPS
    onsets = {o["flag"]: o for o in bodies["parts"]["onsets"]}
    assert (onsets["nonfinite"]["step"], onsets["nonfinite"]["layer"]) == (NAN_STEP, "scale")


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"width": 7},
        {"field": "zero_share", "role": records.ACTIVATION},
        # A zoom across the boundary of the second and third parts, and one inside the last.
        {"start": 9, "end": 18},
        {"start": 22, "end": 23, "width": 1},
    ],
    ids=["whole-run", "7-columns", "zero-share", "zoom-across-parts", "zoom-in-last-part"],
)
def test_timeline_is_the_same_in_parts_in_one_part_and_whole(runs, query):
    bodies = {name: served(runs / name, "timeline", **query) for name in ("parts", "one", "whole")}
    # As JSON, NaN is a value like the others (NaN != NaN in a dict's comparison).
    texts = {name: json.dumps(body, sort_keys=True) for name, body in bodies.items()}
    assert texts["parts"] == texts["one"] == texts["whole"]
    first, last = query.get("start", 1), query.get("end", STEPS)
    assert bodies["parts"]["steps"] == last - first + 1
    assert bodies["parts"]["columns"]["first_step"][0] == first
    assert bodies["parts"]["columns"]["last_step"][-1] == last
    flagged = [layer["flags"]["nonfinite"] for layer in bodies["parts"]["layers"]]
    assert any(flagged) == (last >= NAN_STEP)


def test_check_is_the_same_in_parts_in_one_part_and_whole(runs):
    outputs = {}
    for name in ("parts", "one", "whole"):
        status, out, err = test_onset.run_check(runs / name, "--format", "json")
        outputs[name] = (status, test_onset.strict_json(out), err)
    assert outputs["parts"] == outputs["one"] == outputs["whole"]
    status, body, _ = outputs["parts"]
    (run,) = body["runs"]
    onsets = {o["flag"]: o for o in run["onsets"]}
    assert status == 1 and onsets["nonfinite"]["step"] == NAN_STEP


def test_summary_and_export_are_the_same_in_parts_in_one_part_and_whole(runs):
    for command, options in (("summary", ()), ("export", ("--format", "json"))):
        outputs = {
            name: test_full_records.run_cli(command, runs / name, *options)
            for name in ("parts", "one", "whole")
        }
        assert outputs["parts"] == outputs["one"] == outputs["whole"]
    status, out = outputs["parts"]
    (entry,) = json.loads(out)["steps"]
    assert (status, entry["logged"], entry["full"]) == (0, list(range(1, STEPS + 1)), FULL_STEPS)


def test_each_part_is_read_in_a_request_of_its_own(runs):
    gradviz, reading = plugin_over(runs / "parts")
    gradviz.onset_impl(context.RequestContext(), "", "run")
    read = [tags for plugin_name, tags in reading.reads if plugin_name == digest.PLUGIN_NAME]
    assert all(len(tags) == 1 for tags in read), read
    assert sorted(tag for (tag,) in read) == sorted(digest_tags(load(runs / "parts" / "run")))


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
    assert digest_tags(load(tmp_path)) == [f"{digest.TAG_PREFIX}/budget"]


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


def test_a_zoom_or_another_width_is_cut_from_the_judged_run_without_reading_the_digest_again(runs):
    gradviz, reading = plugin_over(runs / "parts")
    ctx = context.RequestContext()
    whole = gradviz.timeline_impl(ctx, "", "run")
    read = len(reading.reads)
    zoomed = gradviz.timeline_impl(ctx, "", "run", start=16, end=18)
    narrow = gradviz.timeline_impl(ctx, "", "run", width=3)
    parts = set(parts_of(runs / "parts" / "run"))
    assert not any(set(tags) & parts for _, tags in reading.reads[read:]), reading.reads[read:]
    # One step a column in both: the zoom's columns are the whole run's at those steps.
    assert zoomed["columns"]["first_step"] == [16, 17, 18]
    for layer, zoomed_layer in zip(whole["layers"], zoomed["layers"]):
        assert json.dumps(zoomed_layer["rms"]) == json.dumps(
            {side: layer["rms"][side][15:18] for side in ("min", "max")}
        )
        assert zoomed_layer["flags"] == {
            flag: [c - 15 for c in columns if 15 <= c < 18]
            for flag, columns in layer["flags"].items()
        }
    assert narrow["columns"]["first_step"] == [1, 9, 17]
