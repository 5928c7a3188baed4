"""The layer view's precision panel in Chromium against /step (the unscaled mixed_float16 demo)."""

import urllib.parse

import pytest
from tbserver import get_json, running_tensorboard
from test_e2e_browser import PLUGIN_FRAME, _artifacts_dir, browser, gradviz_page  # noqa: F401

pytestmark = pytest.mark.slow

RUN = "unscaled"
LAYER = "conv2"


def share(count, total):
    """The panel's wording of a share (precision.js formatShare)."""
    if not count:
        return "0"
    value = 100 * count / total
    return "<0.1%" if value < 0.1 else f"{value:.1f}%"


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    pytest.importorskip("keras")
    from tb_gradviz import demos

    root = tmp_path_factory.mktemp("precision")
    demos.train_mixed_cnn(root / "logs" / RUN, 1.0, steps=5, log_every=5, verbose=0)
    return root


def test_precision_panel_shows_the_served_record_and_marks_the_flagged_gradients(
    browser,  # noqa: F811
    mixed_run,
):
    def ready(url):
        runs = get_json(f"{url}/data/plugin/gradviz/runs")["runs"]
        return len(runs) == 1 and all(layer["max_step"] == 5 for layer in runs[0]["layers"])

    with running_tensorboard(mixed_run / "logs", mixed_run / "tensorboard.log", ready) as url:
        query = urllib.parse.urlencode({"run": RUN})
        snapshot = get_json(f"{url}/data/plugin/gradviz/step?{query}")
        layer = next(entry for entry in snapshot["layers"] if entry["layer"] == LAYER)
        flagged = {
            tensor
            for flag in layer["flags"]
            if flag["flag"] == "underflow"
            for tensor in flag["tensors"]
        }
        assert flagged == {"input_gradient", "output_gradient"}
        with gradviz_page(browser, url) as page:
            frame = page.frame_locator(PLUGIN_FRAME)
            frame.get_by_label("Layer", exact=True).select_option(LAYER)
            table = frame.locator(".precision-section table.precision-table")
            table.wait_for()
            rows = table.locator("tbody tr")
            assert rows.count() == len(layer["tensors"])
            for name, tensor in layer["tensors"].items():
                row = table.locator(f'tbody tr[data-tensor="{name}"]')
                record = tensor["precision"]
                total = record["finite_nonzero"]
                assert row.locator("td").first.text_content() == str(total)
                assert ("flagged" in (row.get_attribute("class") or "")) == (name in flagged)
                for format_name, settings in record["formats"].items():
                    for setting in ("as_is", "scaled"):
                        counts = settings[setting]
                        cell = row.locator(
                            f'td[data-format="{format_name}"][data-setting="{setting}"]'
                        )
                        assert cell.text_content() == (
                            f"0: {share(counts['to_zero'], total)} · "
                            f"sub: {share(counts['subnormal'], total)} · "
                            f"over: {share(counts['overflow'], total)}"
                        )
            table.screenshot(path=str(_artifacts_dir() / "precision_panel.png"))
