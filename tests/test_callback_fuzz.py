"""Generated bad values for every argument of GradVizCallback and of log_now.

Each bad value must be refused with a TypeError or a ValueError that names
the argument and ends with what was received, either when the callback is
made or when `fit` starts, before the first training step: never a crash
inside `fit`, never accepted, and the model's weights stay as they were.
"""

import fnmatch
import math
import os

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tb_gradviz import GradVizCallback  # noqa: E402

layers = keras.layers
BATCH = 2
LAYER_NAMES = ("conv", "pool", "flat", "dense")
FUZZ = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def small_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            layers.Conv2D(2, 3, padding="same", name="conv"),
            layers.MaxPooling2D(name="pool"),
            layers.Flatten(name="flat"),
            layers.Dense(2, name="dense"),
        ],
        name="small",
    )
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


@pytest.fixture(scope="module")
def model():
    return small_model()


X = np.linspace(-1, 1, BATCH * 16, dtype="float32").reshape(BATCH, 4, 4, 1)
Y = np.ones((BATCH, 2), "float32")


def generator():
    return (batch for batch in [(X, Y)])


# Values no argument accepts where a bool, a count or a name is asked for.
junk = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(-2, 2), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.just(object()),
)
not_a_bool = st.one_of(junk.filter(lambda v: v is not None), st.integers(), st.none())
not_a_count = st.one_of(
    st.integers(max_value=0), st.booleans(), st.floats(), st.text(max_size=3), st.just([1])
)
unknown_name = st.text(alphabet="xyz_/", min_size=1, max_size=6).filter(
    lambda name: not any(fnmatch.fnmatchcase(n, name) or name == n for n in LAYER_NAMES)
)

BAD = {
    "log_dir": st.one_of(
        st.integers(),
        st.none(),
        st.just(""),
        st.floats(allow_nan=False),
        st.lists(st.integers(), max_size=2),
        st.sampled_from(["FILE", "FILE/", "FILE/run"]),
    ),
    "probe_data": st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=3),
        st.just(X),
        st.just((X,)),
        st.just((X, Y, Y, Y)),
        st.just(()),
        st.just((None, Y)),
        st.just((X, None)),
        st.just((X, Y[:1])),
        st.just((X[:0], Y[:0])),
        st.just((X[..., 0], Y)),
        st.just((np.zeros((BATCH, 5, 5, 1), "float32"), Y)),
        st.just(([X, X], Y)),
        st.builds(generator),
        st.builds(lambda: iter([(X, Y)])),
    ),
    "layers": st.one_of(
        st.integers(),
        st.floats(),
        st.just([]),
        st.just([""]),
        st.just([None]),
        st.just([int]),
        st.just(object()),
        unknown_name,
        st.lists(unknown_name, min_size=1, max_size=2),
        st.just(lambda a, b: True),
        st.just(lambda: True),
        st.just(lambda layer: layer.units > 0),
        st.just(lambda layer: False),
        st.builds(lambda: layers.MaxPooling2D(name="stranger")),
    ),
    "every_n_epochs": st.one_of(not_a_count, st.none()),
    "every_n_batches": not_a_count,
    "loss": st.one_of(
        st.integers(),
        st.text(alphabet="qxz", min_size=1, max_size=4),
        st.lists(st.integers(), max_size=2),
        st.just({}),
        st.just(lambda: 0.0),
        st.just(lambda y_true: 0.0),
        st.just(lambda a, b, c: 0.0),
    ),
    "training": not_a_bool,
    "stop_on_nonfinite": not_a_bool,
    "stop_on": st.one_of(
        st.integers(),
        st.floats(),
        st.text(alphabet="qxz", min_size=1, max_size=4),
        st.just([]),
        st.lists(st.integers(), min_size=1, max_size=2),
        st.just(["nonfinite", "sleepy"]),
    ),
    "routing_map": not_a_bool,
    "weights": not_a_bool,
    "routing_map_example": st.one_of(
        st.integers(max_value=-1),
        st.integers(min_value=BATCH, max_value=10**6),
        st.booleans(),
        st.floats(),
        st.text(max_size=2),
        st.just([0]),
    ),
    "routing_map_channels": st.one_of(
        st.integers(max_value=0),
        st.integers(min_value=9),
        st.booleans(),
        st.floats(),
        st.text(max_size=3),
        st.just([]),
        st.lists(st.integers(max_value=-1), min_size=1, max_size=3),
        st.lists(st.integers(0, 20), min_size=9, max_size=12, unique=True),
        st.lists(st.integers(0, 3), min_size=2, max_size=4).filter(lambda c: len(set(c)) < len(c)),
        st.lists(st.floats(0, 3), min_size=1, max_size=2),
    ),
    "routing_map_origin": st.one_of(
        st.integers(),
        st.booleans(),
        st.text(max_size=3),
        st.lists(st.integers(0, 5), max_size=1),
        st.lists(st.integers(0, 5), min_size=3, max_size=4),
        st.tuples(st.integers(max_value=-1), st.integers(0, 5)),
        st.tuples(st.floats(0, 5), st.integers(0, 5)),
    ),
    "budget": st.one_of(
        st.floats(max_value=0.0),
        st.floats(min_value=1.0),
        st.just(math.nan),
        st.booleans(),
        st.text(max_size=3),
        st.just([0.1]),
    ),
}


def named_in_message(name, value, message):
    """The message names the argument and ends with what was received."""
    assert name in message, message
    assert "Received: " in message or "received " in message, message
    if name != "probe_data" and not (name == "log_dir" and str(value).startswith("FILE")):
        assert repr(value)[:40] in message, message


def refused(model, log_root, name, value):
    """Makes the callback with `name=value` and fits with it; returns the error raised."""
    if name == "log_dir" and str(value).startswith("FILE"):
        value = value.replace("FILE", os.path.join(log_root, "a_file"))
    arguments = {"log_dir": os.path.join(log_root, "run"), "probe_data": (X, Y), name: value}
    try:
        callback = GradVizCallback(**arguments)
    except (TypeError, ValueError) as e:
        return e
    before = [np.array(v) for v in model.weights]
    iterations = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    try:
        model.fit(X, Y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[callback])
    except (TypeError, ValueError) as e:
        # Refused when training began: no step was taken, no weight moved.
        assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == iterations
        for expected, variable in zip(before, model.weights):
            np.testing.assert_array_equal(expected, np.array(variable), err_msg=variable.path)
        return e
    pytest.fail(f"GradVizCallback accepted {name}={value!r} and trained with it")


@pytest.fixture(scope="module")
def log_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "a_file").write_text("")
    return str(root)


@pytest.mark.parametrize("name", sorted(BAD))
def test_every_bad_argument_is_refused_before_training_naming_it(model, log_root, name):
    @FUZZ
    @given(value=BAD[name])
    def check(value):
        error = refused(model, log_root, name, value)
        named_in_message(name, value, str(error))

    check()
    assert not os.path.exists(os.path.join(log_root, "run"))  # nothing was ever written


@FUZZ
@given(
    step=st.one_of(
        st.integers(max_value=-1),
        st.booleans(),
        st.floats(),
        st.text(max_size=3),
        st.just([1]),
        st.just(np.float32(2.0)),
    )
)
def test_a_bad_log_now_step_is_refused_before_the_pass_runs(model, log_root, step):
    callback = GradVizCallback(os.path.join(log_root, "log_now"), (X, Y))
    callback.set_model(model)
    with pytest.raises((TypeError, ValueError)) as caught:
        callback.log_now(step=step)
    named_in_message("step", step, str(caught.value))
    assert callback._capture is None  # nothing was built or run
    assert not os.path.exists(os.path.join(log_root, "log_now"))
