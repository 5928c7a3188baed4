"""The layer view's layout at common screen widths, in a real TensorBoard and Chromium.

The unscaled mixed_float16 demo, whose layers all have a precision record: at each
viewport width the precision table and its block-format table fit the main column,
left of the "What am I looking at?" sidebar, and the tab's frame does not scroll sideways.
"""

import pytest
from browser import PRECISION, browser, gradviz_page, tab, wait_drawn  # noqa: F401 (fixture)
from tbserver import get_json, running_tensorboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN = "unscaled"
LAYER = "conv2"
STEPS = 5

# Measured in the tab's frame, in one evaluation: its document's widths, and the table's
# and the sidebar's edges.
MEASURE = """panel => {
  const page = panel.ownerDocument.documentElement;
  const table = panel.querySelector('table.precision-table').getBoundingClientRect();
  const blocks = panel.querySelector('table.block-table').getBoundingClientRect();
  const aside = panel.ownerDocument.querySelector('aside.explanation').getBoundingClientRect();
  return {scrollWidth: page.scrollWidth, clientWidth: page.clientWidth, tableLeft: table.left,
    tableRight: table.right, blocksRight: blocks.right, asideLeft: aside.left, asideWidth: aside.width};
}"""


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    pytest.importorskip("keras")
    from tb_gradviz import demos

    root = tmp_path_factory.mktemp("layout")
    demos.train_mixed_cnn(root / "logs" / RUN, 1.0, steps=STEPS, log_every=STEPS, verbose=0)

    def ready(url):
        runs = get_json(f"{url}/data/plugin/gradviz/runs")["runs"]
        return len(runs) == 1 and all(layer["max_step"] == STEPS for layer in runs[0]["layers"])

    with running_tensorboard(root / "logs", root / "tensorboard.log", ready) as url:
        yield url


@pytest.mark.parametrize("width", [1400, 1600, 1920])
def test_the_precision_table_fits_left_of_the_sidebar_and_the_frame_does_not_scroll_sideways(
    browser,  # noqa: F811
    mixed_run,
    width,
):
    fragment = f"gradviz&run={RUN}&layer={LAYER}&step={STEPS}"
    with gradviz_page(browser, mixed_run, width, 1000, fragment) as page:
        panel = wait_drawn(tab(page), PRECISION, run=RUN, layer=LAYER, step=STEPS)
        box = panel.evaluate(MEASURE)
        # The sidebar is beside the main column at these widths, not under it.
        assert box["asideWidth"] > 0 and box["asideLeft"] > box["tableLeft"], box
        assert box["tableRight"] <= box["asideLeft"], box
        assert box["blocksRight"] <= box["asideLeft"], box
        assert box["scrollWidth"] <= box["clientWidth"], box
