"""Full records on a schedule, the digest at every event (`full_records=`, format/full_records.py).

Real fits write the runs; the steps of each record are read back through
TensorBoard's own event reader.
"""

import json
import urllib.parse

import eventdata
import numpy as np
import pytest
import tbserver
import test_onset

from tb_gradviz.board import kept
from tb_gradviz.format import digest, full_records, judgement, records

keras = pytest.importorskip("keras")

STEPS = 60
NAN_STEP = 36
# full_records=4: every event of the first 4 (steps 1-4), then spacings 1, 2, 3, ...:
# events 4, 6, 9, 13, 18, 24, 31, 39, 48, 58, at steps one above.
SCHEDULED = [1, 2, 3, 4, 5, 7, 10, 14, 19, 25, 32, 40, 49, 59]


def test_the_schedule_keeps_the_first_events_then_spacings_that_grow_by_one():
    kept = [i for i in range(60) if full_records.scheduled(i, 4)]
    assert kept == [0, 1, 2, 3, 4, 6, 9, 13, 18, 24, 31, 39, 48, 58]
    assert [i for i in range(12) if full_records.scheduled(i, 0)] == [0, 2, 5, 9]
    assert all(full_records.scheduled(i, None) for i in range(100))
    # About first + sqrt(2 * (n - first)) of n events.
    n = 10_000
    count = sum(full_records.scheduled(i, full_records.DEFAULT_FIRST) for i in range(n))
    assert count == 100 + 140  # T_140 = 9870 <= 9900 < T_141 = 10011


@pytest.mark.parametrize(
    "value, error",
    [("some", TypeError), (1.5, TypeError), (True, TypeError), (-1, ValueError)],
)
def test_a_bad_full_records_is_refused_naming_what_is_allowed(value, error):
    with pytest.raises(error, match=r"number of log events >= 0 or 'all'.*Received: full_records"):
        full_records.check_first(value)


def fit_cnn(log_dir, nan_step=None, full=4):
    """A tiny CNN (tanh, so no channel is dead) fitted STEPS steps, logged at every one."""
    from tb_gradviz import GradVizCallback

    keras.utils.set_random_seed(0)
    scale = test_onset.Scale(name="scale")
    model = keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.Conv2D(3, 3, padding="same", activation="tanh", name="conv"),
            scale,
            keras.layers.MaxPooling2D(2, name="pool"),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(3, name="head"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.01), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 2, 6, 6, 2)).astype("float32")
    y = rng.normal(size=(STEPS * 2, 3)).astype("float32")
    callbacks = [] if nan_step is None else [test_onset.SetFactorAt(scale, nan_step, float("nan"))]
    callbacks.append(
        GradVizCallback(
            log_dir,
            (x[:4], y[:4]),
            layers=["conv", "scale", "pool", "head"],
            every_n_batches=1,
            full_records=full,
        )
    )
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)


def steps_of(log, tag):
    return [step for step, _ in eventdata.values(log, tag)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("full_records")
    fit_cnn(root / "nan", nan_step=NAN_STEP)
    return root


def test_full_records_follow_the_schedule_and_a_nan_s_onset_keeps_its_step_and_the_one_before(
    runs,
):
    log = eventdata.load(runs / "nan")
    (tag,) = eventdata.digest_tags(log)
    assert steps_of(log, tag) == list(range(1, STEPS + 1))
    expected = sorted(SCHEDULED + [NAN_STEP - 1, NAN_STEP])
    full = [t for t in eventdata.tensor_tags(log) if not t.startswith(digest.TAG_PREFIX)]
    assert full
    for t in full:
        assert steps_of(log, t) == expected, t
    assert steps_of(log, records.histogram_tag("scale", records.ACTIVATION)) == expected
    # The records at the onset hold the NaN; those of the step before do not.
    stats = dict(eventdata.values(log, records.stats_tag("scale", records.ACTIVATION)))
    assert records.decode_stats(stats[NAN_STEP])["nan"] > 0
    assert records.decode_stats(stats[NAN_STEP - 1])["nan"] == 0


def run_cli(*args):
    import contextlib
    import io

    from tb_gradviz import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main([*map(str, args)])
    return status, out.getvalue()


def test_summary_and_export_name_the_steps_with_full_records(runs):
    expected = sorted(SCHEDULED + [NAN_STEP - 1, NAN_STEP])
    status, out = run_cli("summary", runs / "nan")
    assert status == 0
    assert (
        "full records at 16 of 60 logged steps: 1-5, 7, 10, 14, 19, 25, 32, 35-36, 40, 49, 59; "
        "the others have the digest only" in out
    )
    status, out = run_cli("export", runs / "nan", "--format", "json")
    assert status == 0
    (entry,) = json.loads(out)["steps"]
    assert entry == {"run": ".", "logged": list(range(1, STEPS + 1)), "full": expected}
    # The onset check names is a step with full records.
    status, out = run_cli("check", runs / "nan", "--format", "json")
    (run,) = json.loads(out)["runs"]
    (nonfinite,) = [o for o in run["onsets"] if o["flag"] == "nonfinite"]
    assert nonfinite["step"] == NAN_STEP


def test_describe_counts_the_middle_groups_past_the_ones_shown():
    assert kept.describe([1, 2, 3, 5, 7, 8]) == "1-3, 5, 7-8"
    assert kept.describe([1, 3, 5, 7, 9, 11, 12], shown=4) == "1, 3, ... 2 more steps ..., 9, 11-12"
    assert kept.describe([1, 3, 5, 7, 9, 10], shown=4) == "1, 3, ... 1 more step ..., 7, 9-10"
    assert kept.describe([]) == ""


def served_steps(url, route, **query):
    text = urllib.parse.urlencode(dict(query, run="nan"))
    return tbserver.get_json(f"{url}/data/plugin/gradviz/{route}?{text}")


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", ["false", "true"])
def test_both_loaders_serve_the_records_of_the_step_before_an_onset_written_after_its_digest(
    runs, tmp_path, load_fast
):
    def series(url):
        return served_steps(url, "series", layer="scale", tensor=records.ACTIVATION)["steps"]

    with tbserver.running_tensorboard(
        runs,
        tmp_path / "tensorboard.log",
        ready=lambda url: series(url)[-1] == SCHEDULED[-1],
        extra_args=(f"--load_fast={load_fast}",),
    ) as url:
        assert series(url) == sorted(SCHEDULED + [NAN_STEP - 1, NAN_STEP])
        timeline = served_steps(url, "timeline")
        assert timeline["columns"]["first_step"] == list(range(1, STEPS + 1))
        (nonfinite,) = [o for o in served_steps(url, "onset")["onsets"] if o["flag"] == "nonfinite"]
        assert nonfinite["step"] == NAN_STEP
        at_onset = served_steps(url, "series", layer="scale", tensor="activation", step=NAN_STEP)
        assert at_onset["steps"] == [NAN_STEP] and at_onset["stats"]["nan"][0] > 0


def test_the_keeper_writes_the_held_event_before_an_onset_once_without_a_second_digest():
    import synthetic

    keeper = full_records.Keeper(first=2)
    judge = judgement.Judge()
    written = []
    for event in range(10):
        rng = np.random.default_rng(event)
        # From event 6 on, a's output gradient is 1e-5 of b's scale: vanishing.
        scale = 1e-5 if event >= 6 else 1.0
        event_records = synthetic.pool_records(rng, "a", 0, gradient_scale=scale)
        event_records += synthetic.pool_records(rng, "b", 1)
        judged = judge.judge(10 * event, event_records)
        for step, to_write, wall_time in keeper.writes(
            10 * event, event_records, judged, wall_time=event
        ):
            tags = [tag for tag, _, _ in to_write]
            digests = sum(tag.startswith(digest.TAG_PREFIX + "/") for tag in tags)
            written.append((event, step, wall_time, len(tags) - digests > 0, digests))
    assert keeper.raised == {"vanishing"}
    # (event deciding, step, wall time, full records, digests): the schedule keeps 0, 1, 2, 4, 7;
    # the onset at 6 writes 5's held records first, at 5's step and time.
    assert written == [
        (0, 0, 0, True, 1),
        (1, 10, 1, True, 1),
        (2, 20, 2, True, 1),
        (3, 30, 3, False, 1),
        (4, 40, 4, True, 1),
        (5, 50, 5, False, 1),
        (6, 50, 5, True, 0),
        (6, 60, 6, True, 1),
        (7, 70, 7, True, 1),
        (8, 80, 8, False, 1),
        (9, 90, 9, False, 1),
    ]


def test_a_run_shorter_than_the_default_schedule_is_the_same_bytes_as_with_every_event_kept(
    tmp_path,
):
    fit_cnn(tmp_path / "default", full=full_records.DEFAULT_FIRST)
    fit_cnn(tmp_path / "all", full=full_records.ALL)

    def sizes(run):
        return [path.stat().st_size for path in sorted(run.glob("events.out.tfevents.*"))]

    assert sizes(tmp_path / "default") == sizes(tmp_path / "all")
    log = eventdata.load(tmp_path / "default")
    assert steps_of(log, records.stats_tag("head", records.ACTIVATION)) == list(range(1, STEPS + 1))
