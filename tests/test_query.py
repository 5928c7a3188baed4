"""Every route's query arguments, over HTTP through `TensorBoardWSGI`: a bad value is a 400 that
names the argument, what is allowed and what was received, never a 500 (docs/API.md)."""

import json

import pytest
import synthetic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_plugin import PREFIX, make_app

from tb_gradviz.board import query, timeline
from tb_gradviz.format import records

LAYER = "block0/pool"

# Each route: the names it needs, and the values it reads.
ROUTES = {
    "/series": ({"run": "run", "layer": LAYER, "tensor": "activation"}, ("width", "step")),
    "/routing": ({"run": "run", "layer": LAYER}, ("step",)),
    "/step": ({"run": "run"}, ("step", "ratio")),
    "/routing_map": ({"run": "run", "layer": LAYER}, ("step",)),
    "/timeline": ({"run": "run"}, ("field", "role", "width", "ratio", "start", "end")),
    "/onset": ({"run": "run"}, ("ratio",)),
}

# What each value must be, as its 400 says.
ALLOWED = {
    "width": f"width must be a whole number from 1 to {timeline.MAX_WIDTH}",
    "step": "step must be a decimal integer of at most 40 characters",
    "start": "start must be a decimal integer of at most 40 characters",
    "end": "end must be a decimal integer of at most 40 characters",
    "ratio": "ratio must be a finite number above 1, in decimal of at most 40 characters",
    "field": f"field must be one of {', '.join(timeline.FIELDS)}",
    "role": f"role must be one of {', '.join(records.ROLES)}",
}

BAD = ["\u00b2", "9" * 5000, "-1", "1e3", "", " 5", "5 ", "0x10", "\u0664", "1_0", "5\n", "+5"]

# The bad values that are allowed values of some arguments, and what a route then answers: a
# negative step has no logged step at or before it (nor a range that ends there), a range that
# starts there holds them all; a ratio may be written with an exponent.
VALID = {
    ("step", "-1"): 404,
    ("end", "-1"): 404,
    ("start", "-1"): 200,
    ("ratio", "1e3"): 200,
    ("ratio", "+5"): 200,
}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("query")
    synthetic.write_run(root / "run", layers=1, steps=3)
    return make_app(root)[0]


def answer(client, route, **query):
    response = client.get(PREFIX + route, query_string=query)
    return response.status_code, response.get_data(as_text=True)


def received(text):
    """How a 400 quotes a received value: whole up to 40 characters, else its start and length."""
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"


@pytest.mark.parametrize(
    "route, argument",
    [(route, argument) for route, (_, read) in ROUTES.items() for argument in read],
)
@pytest.mark.parametrize("value", BAD, ids=ascii)
def test_a_bad_value_of_every_route_is_a_400_naming_what_is_allowed(client, route, argument, value):
    names, _ = ROUTES[route]
    status, text = answer(client, route, **names, **{argument: value})
    if (argument, value) in VALID:
        assert status == VALID[(argument, value)], text
        return
    assert status == 400, text
    assert f"{ALLOWED[argument]}; received {received(value)}" in text


@pytest.mark.parametrize("route", ROUTES)
def test_a_missing_or_repeated_name_is_a_400(client, route):
    names, _ = ROUTES[route]
    for name in names:
        status, text = answer(client, route, **{k: v for k, v in names.items() if k != name})
        assert (status, f"missing query argument {name!r}" in text) == (400, True), text
        repeated = [(k, v) for k, v in names.items()] + [(name, names[name])]
        response = client.get(PREFIX + route, query_string=repeated)
        assert response.status_code == 400
        assert f"query argument {name!r} given 2 times; give it once" in response.get_data(
            as_text=True
        )


@pytest.mark.parametrize("route", ["/step", "/timeline", "/onset"])
def test_a_ratio_longer_than_40_characters_is_a_400_not_another_number(client, route):
    # Its first 40 characters are another number, 1e39: the whole text is refused.
    longer = "1" + "0" * 40
    status, text = answer(client, route, run="run", ratio=longer)
    assert status == 400, text
    assert f"{ALLOWED['ratio']}; received {longer[:40]!r}... (41 characters)" in text
    status, text = answer(client, route, run="run", ratio=longer[:40])
    assert status == 200, text
    body = json.loads(text, parse_constant=float)
    # /timeline does not repeat its ratio.
    assert {"/step": body.get("health", {}).get("ratio"), "/onset": body.get("ratio")}.get(
        route, 1e39
    ) == 1e39


@pytest.mark.parametrize("width", ["1", "007", str(timeline.MAX_WIDTH)])
def test_widths_in_range_are_served(client, width):
    status, text = answer(client, "/series", **ROUTES["/series"][0], width=width)
    assert status == 200 and json.loads(text)["steps"] == [1, 2, 3], text
    status, text = answer(client, "/timeline", run="run", width=width)
    assert status == 200 and json.loads(text)["steps"] == 3, text


def test_a_step_beyond_int64_is_the_latest_step(client):
    status, text = answer(client, "/step", run="run", step="9" * 40)
    assert status == 200 and json.loads(text)["step"] == 3
    assert query.step("-" + "9" * 39) == query.INT64_MIN


def test_values_are_parsed_as_their_kind():
    assert query.width("0010") == 10
    assert query.step("-12") == -12
    assert query.start("30") == 30 and query.end("9" * 40) == query.INT64_MAX
    assert query.ratio("1.5e3") == 1500.0 and query.ratio(".5e1") == 5.0 and query.ratio("2.") == 2
    assert query.field("rms") == "rms" and query.role("activation") == "activation"
    for text in ("1.", "1", "1e400", "inf", "nan", "."):
        with pytest.raises(query.errors.InvalidArgumentError, match="ratio must be"):
            query.ratio(text)


_KEYS = st.sampled_from(
    ["run", "layer", "tensor", "step", "width", "ratio", "field", "role", "start", "end"]
)
_VALUES = st.one_of(
    st.sampled_from(["run", LAYER, "activation", "1", "3", "1e3", "rms", "input_gradient", ""]),
    st.text(max_size=50),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.floats().map(str),
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
)


@settings(
    max_examples=800, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(
    route=st.sampled_from([*ROUTES, "/runs", "/updates"]),
    names=st.booleans(),
    extra=st.lists(st.tuples(_KEYS, _VALUES), max_size=4),
)
def test_fuzzed_arguments_of_every_route_never_fail_with_500(client, route, names, extra):
    given_names = list(ROUTES.get(route, ({"run": "run", "layer": LAYER}, ()))[0].items())
    response = client.get(PREFIX + route, query_string=(given_names if names else []) + extra)
    assert response.status_code in (200, 400, 404), (route, extra, response.status_code)
