"""The 'Over time' view's requests, in a real TensorBoard and Chromium.

Two synthetic runs of one max pool each, under different names ("a" has
`pool_a`, "b" has `pool_b`): subtracting one from the other has no layer to
subtract. Every wait is for a state the view says it has drawn (`browser.wait_drawn`)
or for an answer the page has read, never a sleep.
"""

import re

import numpy as np
import pytest
import synthetic
from browser import (  # noqa: F401 (fixture)
    TIMELINE,
    WAIT_MS,
    PageProblems,
    browser,
    gradviz_page,
    runs_loaded,
    tab,
    wait_drawn,
)
from tbserver import running_tensorboard

from tb_gradviz.format import events

try:
    from playwright.sync_api import expect
except ImportError:  # the `browser` fixture says so, and fails in CI
    expect = None

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STEPS = 3
LAYERS = {"a": "pool_a", "b": "pool_b"}

# Records, in the tab's frame, each answer whose body the page has read, once the
# page's own continuations of that read (promise callbacks, no timer) have run: a
# timer set when the body is read fires after them.
ANSWERS_READ = """
(() => {
  const text = Response.prototype.text;
  window.gradvizAnswersRead = [];
  Response.prototype.text = async function () {
    const body = await text.call(this);
    const url = this.url;
    setTimeout(() => window.gradvizAnswersRead.push(url), 0);
    return body;
  };
})();
"""


def _write_pool_run(run_dir, layer):
    """A run of one synthetic 2x2/2 max pool named `layer`, with its digest, at steps 1..STEPS."""
    rng = np.random.default_rng(0)
    log = events.EventLog(run_dir)
    try:
        for step in range(1, STEPS + 1):
            log.write(step, synthetic.pool_records(rng, layer, 0, step=step - 1))
    finally:
        log.close()


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    root = tmp_path_factory.mktemp("overtime")
    for run, layer in LAYERS.items():
        _write_pool_run(root / "logs" / run, layer)
    with running_tensorboard(
        root / "logs", root / "tensorboard.log", runs_loaded(dict.fromkeys(LAYERS, STEPS))
    ) as url:
        yield url


def test_minus_a_run_that_shares_no_layer_says_so_instead_of_throwing(browser, tensorboard):  # noqa: F811
    with gradviz_page(browser, tensorboard, 1400, 1000, "gradviz&run=a&view=timeline") as page:
        frame = tab(page)
        wait_drawn(frame, TIMELINE, run="a", colour="rms/output_gradient", against=None)
        frame.get_by_label("Minus run", exact=True).select_option("b")
        wait_drawn(frame, TIMELINE, run="a", colour="rms/output_gradient", against="b")
        expect(frame.locator(".timeline-status")).to_have_text(
            "No shared layers between run a and run b: nothing to subtract. "
            'Choose another run under "Minus run", or (none).'
        )
        expect(frame.locator("canvas.timeline-canvas")).to_have_count(0)
        # Back to no run subtracted: the run's own rows again.
        frame.get_by_label("Minus run", exact=True).select_option("")
        wait_drawn(frame, TIMELINE, run="a", colour="rms/output_gradient", against=None)
        expect(frame.locator("canvas.timeline-canvas")).to_have_attribute("data-rows", "1")


def test_a_slow_answer_for_an_older_colour_does_not_draw_over_a_newer_one(browser, tensorboard):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(WAIT_MS)
    problems = PageProblems(page)
    held = []

    def hold_the_first_rms_of_the_activation(route):
        url = route.request.url
        if not held and "field=rms" in url and "role=activation" in url:
            held.append(route)
        else:
            route.continue_()

    try:
        page.add_init_script(ANSWERS_READ)
        page.route(
            re.compile(r"/data/plugin/gradviz/timeline\?"), hold_the_first_rms_of_the_activation
        )
        page.goto(f"{tensorboard}/#gradviz&run=a&view=timeline")
        frame = tab(page)
        wait_drawn(frame, TIMELINE, run="a", colour="rms/output_gradient", against=None)
        colour = frame.get_by_label("Colour", exact=True)
        # The older colour's answer is held; the newer one's is drawn.
        colour.select_option("rms/activation")
        colour.select_option("zero_share/output_gradient")
        wait_drawn(frame, TIMELINE, run="a", colour="zero_share/output_gradient", against=None)
        assert len(held) == 1, held
        held_url = held[0].request.url
        held[0].continue_()
        plugin = next(f for f in page.frames if "plugin_entry.html" in f.url)
        plugin.wait_for_function("(url) => window.gradvizAnswersRead.includes(url)", arg=held_url)
        # The older answer has been read, and all the page did with it is done: it drew nothing.
        wait_drawn(frame, TIMELINE, run="a", colour="zero_share/output_gradient", against=None)
        canvas = frame.locator("canvas.timeline-canvas")
        assert canvas.get_attribute("aria-label").startswith("share of exact zeros of 1 layers")
        assert colour.input_value() == "zero_share/output_gradient"
        assert problems.errors == []
    finally:
        page.close()
