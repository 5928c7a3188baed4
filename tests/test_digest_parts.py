"""The digest written in parts (layout 13) and read back joined: no size cliff (issue 30, item 3).

A real fit whose digest spans several parts (a tiny `digest_parts.PART_BYTES`)
serves the `/onset`, `/timeline`, `check`, `summary` and `export` of the same
run written as one part and as one series under the rows' tag (before layout
13); a NaN in a later part is named at its true step; each part is read in a
request of its own, and a zoom reads none. Runs written with numpy:
`test_digest_parts_written.py`.
"""

import json

import pytest
import test_full_records
import test_onset
from eventdata import load, plugin_over, tensor_tags, values
from tensorboard import context
from tensorboard.util import tensor_util
from test_digest_parts_written import digest_tags, parts_of, served

from tb_gradviz.format import digest, digest_parts, events, metadata, records

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

    scale = test_onset.Scale(name="scale")
    model, x, y = test_onset.middle_layer_network(scale, examples=4 * steps)
    callbacks = [
        test_onset.SetFactorAt(scale, NAN_STEP, float("nan")),
        GradVizCallback(
            logdir, (x[:8], y[:8]), layers=LAYERS, every_n_batches=1, full_records=FULL_FIRST
        ),
    ]
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)


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
            if content["kind"] == metadata.KIND_DIGEST_LEVEL:
                continue  # the writer pools the digests it is given into levels again
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
