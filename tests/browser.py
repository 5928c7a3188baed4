"""The one way browser tests drive the GradViz tab: Debian's Chromium, the tab's frame, and
waiting until a view says it has drawn the state a test asked for.

Each view of the tab says on its own element which state it shows: a `data-drawn`
attribute (frontend/drawn.js), JSON of the state's entries (run, layer, step, ...) with
sorted keys, set once that state's data has been fetched and drawn. A view still fetching
or drawing keeps the marker of the state it shows. So a test asks for a state (a click, a
selection, a URL), waits with `wait_drawn(frame, VIEW, **state)` for that view's marker to
name it, and only then reads the view: waiting for an element is not enough, since the
previous state's element exists too.

Every wait has the same limit, `WAIT_MS`, long enough for a loaded two-core machine.
"""

import contextlib
import json
import os
import pathlib
import re
import shutil
import time

import pytest
from tbserver import get_json

try:
    from playwright.sync_api import expect
except ImportError:  # the `browser` fixture says so, and fails in CI
    expect = None

CHROMIUM = "/usr/bin/chromium"  # Debian's: playwright's own download needs the network
# Headless as root, with nothing that reaches for the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PLUGIN_FRAME = 'iframe[src*="plugin_entry.html?name=gradviz"]'

# The limit of every wait: a page action, an `expect`, a view's marker.
WAIT_MS = 90_000
if expect is not None:
    expect.set_options(timeout=WAIT_MS)

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

# The views, by the element that carries their `data-drawn` marker, and what it names. The
# time view, the onset table and the routing map add `error` when the fetch failed.
LAYER_TITLE = ".layer-title"  # run, layer, step, logarithmic
PANELS = ".layer-main > .panels"  # run, layer, step, logarithmic
HEATMAPS = ".heatmaps"  # run, layer, step, logarithmic
WEIGHTS_ROW = ".weights-section"  # run, layer, step, logarithmic
PRECISION = ".precision-section"  # run, layer, step
ASIDE = "aside.explanation"  # run, layer, step (the routing card and the explanation)
ROUTING_MAP = ".routemap-container"  # run, layer, step (the map's), channel
FLOW = ".flow-container"  # run, step, against (overlaid run), kept (steps), layer
GRID = ".grid-container"  # run, step, layer
# The time view's marker: run, colour, against, range ([start, end] or null); once /onset is
# in, also onsets and warnings (how many onsets of flags and of warnings it marks).
TIMELINE = "section.timeline-section"
ONSET = ".onset-section"  # run
COMPARE = ".compare-charts"  # run, layer, tensor, against, step

SECTIONS = {
    "layer": "The layer",
    "layers": "Across layers",
    "timeline": "Over time",
    "compare": "Compare runs",
}


def _missing_browser(reason):
    # In CI a missing browser is a broken machine, not a reason to pass.
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}, and CI=true: browser tests must run in CI")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, for the module's tests."""
    if not os.path.exists(CHROMIUM):
        _missing_browser(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing_browser("Python playwright is not installed")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


class PageProblems:
    """Collects what must not happen on a page: errors, failed requests, dialogs."""

    # The browser asks for /favicon.ico of a page that names none (the plugin's
    # entry page opened on its own); TensorBoard has none to give.
    IGNORED_URL_ENDINGS = ("/favicon.ico",)

    def __init__(self, page):
        self.errors = []
        self.dialogs = []
        page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        page.on("console", self._on_console)
        page.on(
            "requestfailed",
            lambda request: self._add(request.url, f"request failed: {request.url}"),
        )
        page.on(
            "response",
            lambda response: (
                response.status >= 400
                and self._add(response.url, f"HTTP {response.status}: {response.url}")
            ),
        )

        def on_dialog(dialog):
            self.dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)

    def _add(self, url, problem):
        if not url.endswith(self.IGNORED_URL_ENDINGS):
            self.errors.append(problem)

    def _on_console(self, message):
        if message.type == "error":
            self._add(
                message.location.get("url", ""),
                f"console error: {message.text} at {message.location}",
            )


def artifacts_dir():
    """Where screenshots are kept: TB_GRADVIZ_ARTIFACTS, or artifacts/ at the repository root."""
    path = pathlib.Path(os.environ.get("TB_GRADVIZ_ARTIFACTS") or REPO_ROOT / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def gradviz_page(browser, url, width=1600, height=1000, fragment="gradviz", standalone=False):
    """A new page on the GradViz tab of the TensorBoard at `url`, closed on leaving.

    `fragment` is the URL's (`gradviz&view=layers` opens "Across layers");
    `standalone` opens the plugin's own page instead, outside TensorBoard.
    Leaving the block normally asserts that no error, failed request or
    dialog happened on the page (`PageProblems`).
    """
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(WAIT_MS)
    problems = PageProblems(page)
    try:
        page.goto(
            f"{url}/data/plugin_entry.html?name=gradviz" if standalone else f"{url}/#{fragment}"
        )
        yield page
        assert problems.errors == [], problems.errors
        assert problems.dialogs == [], problems.dialogs
    finally:
        page.close()


def tab(page):
    """The GradViz tab's frame in TensorBoard's page."""
    return page.frame_locator(PLUGIN_FRAME)


def keep_screenshot(locator, path):
    """Saves a screenshot of `locator` at `path` (a test's tmp folder), and a copy in
    TB_GRADVIZ_ARTIFACTS when set."""
    locator.screenshot(path=str(path))
    if os.environ.get("TB_GRADVIZ_ARTIFACTS"):
        folder = pathlib.Path(os.environ["TB_GRADVIZ_ARTIFACTS"])
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / path.name)
    print(f"\nscreenshot: {path}")


def runs_loaded(expected_max_step):
    """A readiness check for `running_tensorboard`: every run lists every layer, up to its
    last step."""

    def ready(url):
        runs = get_json(f"{url}/data/plugin/gradviz/runs")["runs"]
        return len(runs) == len(expected_max_step) and all(
            layer["max_step"] == expected_max_step[run["run"]]
            for run in runs
            for layer in run["layers"]
        )

    return ready


def drawn_text(value):
    """A state value as the marker writes it (JSON.stringify's text of it)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def drawn_pattern(**state):
    """A pattern of the markers that hold each of `state`'s entries (and maybe others)."""
    entries = "".join(
        f"(?=.*[{{,]{re.escape(drawn_text(key))}:{re.escape(drawn_text(value))}[,}}])"
        for key, value in state.items()
    )
    return re.compile(f"^{entries}")


def wait_drawn(frame, selector, **state):
    """Waits until the view at `selector` says it has drawn `state` (its entries, among others).

    Args:
      frame: the tab's frame (`tab(page)`), or the page when the tab is opened on its own.
      selector: the view's element, one of this module's view constants.
      **state: what the view must show, as its marker names it (run=, layer=, step=, ...).

    Returns:
      the view's locator, to read it.
    """
    view = frame.locator(selector)
    expect(view).to_have_attribute("data-drawn", drawn_pattern(**state), timeout=WAIT_MS)
    return view


def wait_time_view(frame, run, **state):
    """Waits until "Over time" has drawn `run` (and `state`, as `wait_drawn` takes it) and the
    onset table above the drawing has drawn `run` too: the table's rows, drawn when `/onset`
    answers, move the drawing down, so a position on the canvas is only the one meant once
    both are in.

    Returns:
      the time view's locator.
    """
    wait_drawn(frame, ONSET, run=run)
    return wait_drawn(frame, TIMELINE, run=run, **state)


def read_drawn(frame, selector, reader, **state):
    """`reader(element)` of the view at `selector`, once it has drawn `state`.

    The view is read in one evaluation in the page, which no redraw (a resize
    draws the same state anew) can interleave with.
    """
    return wait_drawn(frame, selector, **state).evaluate(reader)


class HeldRequests:
    """Holds back the page's requests whose URL `matches` until `release()`: a test sees what
    a view shows while its answer is on its way, whatever the machine's speed."""

    def __init__(self, page, matches):
        self.page = page
        self.routes = []
        self.released = False
        page.route(matches, self._hold)

    def _hold(self, route):
        if self.released:
            route.continue_()
        else:
            self.routes.append(route)

    def wait(self):
        """Returns once a request is held (each round trip to the page lets the handler run)."""
        deadline = time.monotonic() + WAIT_MS / 1000
        while not self.routes:
            assert time.monotonic() < deadline, "no request to hold was made"
            self.page.evaluate("0")

    def release(self):
        self.released = True
        for route in self.routes:
            route.continue_()


def show_section(frame, view):
    """Chooses a section of the tab (`layer`, `layers`, `timeline` or `compare`); waits until
    it is shown."""
    frame.get_by_role("tab", name=SECTIONS[view]).click()
    expect(frame.get_by_role("tab", name=SECTIONS[view])).to_have_attribute("aria-selected", "true")
    expect(frame.get_by_role("tabpanel")).to_have_attribute("data-view", view)
