"""The tests' pattern of a view's `data-drawn` marker (tests/browser.py) against the markers
the tab writes (frontend/drawn.js, run under node): a wait for a state matches that state's
marker, with or without other entries, and no marker of another state."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import limits
import pytest
from browser import drawn_pattern

DRAWN_JS = Path(__file__).resolve().parent.parent / "frontend" / "drawn.js"

STATES = [
    {"run": "mixed", "layer": "conv2", "step": 5},
    {"run": "a", "step": 12, "against": None, "kept": [3, 1], "layer": "pool"},
    {"run": "a", "colour": "flush_share/output_gradient", "against": None},
    {"run": '"><svg onload=alert(2)>', "layer": "<img src=x onerror=alert(1)>", "step": 3},
    {"run": "é/ü (1)", "layer": "a.b*c+d", "step": 0, "logarithmic": False},
]


@pytest.fixture(scope="module")
def markers():
    """The tab's marker of each of STATES."""
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("node is not on PATH; the marker's test needs Node.js 18+")
        pytest.skip("node is not on PATH")
    script = (
        f"import({json.dumps(DRAWN_JS.as_uri())}).then(({{drawnState}}) => "
        f"console.log(JSON.stringify({json.dumps(STATES)}.map(drawnState))))"
    )
    done = subprocess.run(
        [node, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=limits.CHILD_S,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_wait_matches_the_marker_of_its_state_and_of_no_other(markers):
    for state, marker in zip(STATES, markers):
        assert json.loads(marker) == state
        assert drawn_pattern(**state).search(marker), (state, marker)
        for key in state:
            # Asking for part of the state matches too: a test names what it asked for.
            assert drawn_pattern(**{key: state[key]}).search(marker), (key, marker)
    for i, state in enumerate(STATES):
        for j, marker in enumerate(markers):
            if i != j:
                assert not drawn_pattern(**state).search(marker), (state, marker)


def test_a_wait_does_not_match_a_marker_that_differs_in_one_entry(markers):
    marker = markers[0]  # {"layer":"conv2","run":"mixed","step":5}
    assert not drawn_pattern(step=50).search(marker)
    assert not drawn_pattern(step="5").search(marker)
    assert not drawn_pattern(layer="conv").search(marker)
    assert not drawn_pattern(run="mixed", layer="conv2", step=5, logarithmic=True).search(marker)
    assert not drawn_pattern(run="conv2").search(marker)
