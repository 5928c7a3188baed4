"""The layer view's precision panel in Chromium against /step (the unscaled mixed_float16 demo)."""

import json
import urllib.parse

import pytest
from browser import (  # noqa: F401 (fixture)
    PRECISION,
    HeldRequests,
    artifacts_dir,
    browser,
    gradviz_page,
    tab,
    wait_drawn,
)
from tbserver import get_json, running_tensorboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

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

    def ready(url):
        runs = get_json(f"{url}/data/plugin/gradviz/runs")["runs"]
        return len(runs) == 1 and all(layer["max_step"] == 5 for layer in runs[0]["layers"])

    with running_tensorboard(root / "logs", root / "tensorboard.log", ready) as url:
        query = urllib.parse.urlencode({"run": RUN})
        yield url, get_json(f"{url}/data/plugin/gradviz/step?{query}")


def _layer(snapshot, name):
    return next(entry for entry in snapshot["layers"] if entry["layer"] == name)


def _shown_table(panel):
    """The panel's casts table: per row (tensor), its non-zero count and its cells by format and
    setting."""
    return panel.evaluate(
        """panel => Object.fromEntries([...panel.querySelectorAll('table.precision-table tbody tr')].map((row) => [
          row.dataset.tensor, {
            total: row.querySelector('td').textContent,
            flagged: row.classList.contains('flagged'),
            cells: Object.fromEntries([...row.querySelectorAll('td[data-format]')].map((cell) =>
              [`${cell.dataset.format}/${cell.dataset.setting}`, cell.textContent])),
          }]))"""
    )


def _served_table(layer):
    """What the panel must show of `layer`'s /step entry, worded as precision.js words it."""
    flagged = {
        tensor
        for flag in layer["flags"]
        if flag["flag"] in ("underflow", "overflow")
        for tensor in flag.get("tensors") or [flag["tensor"]]
    }
    table = {}
    for name, tensor in layer["tensors"].items():
        record = tensor["precision"]
        total = record["finite_nonzero"]
        table[name] = {
            "total": str(total),
            "flagged": name in flagged,
            "cells": {
                f"{format_name}/{setting}": (
                    f"0: {share(counts['to_zero'], total)} · "
                    f"sub: {share(counts['subnormal'], total)} · "
                    f"over: {share(counts['overflow'], total)}"
                )
                for format_name, settings in record["formats"].items()
                for setting, counts in settings.items()
                if setting in ("as_is", "scaled")
            },
        }
    return table


def test_precision_panel_shows_the_served_record_and_marks_the_flagged_gradients(
    browser,  # noqa: F811
    mixed_run,
):
    url, snapshot = mixed_run
    layer = _layer(snapshot, LAYER)
    flagged = {
        tensor
        for flag in layer["flags"]
        if flag["flag"] == "underflow"
        for tensor in flag["tensors"]
    }
    assert flagged == {"input_gradient", "output_gradient"}
    with gradviz_page(browser, url) as page:
        frame = tab(page)
        frame.get_by_label("Layer", exact=True).select_option(LAYER)
        panel = wait_drawn(frame, PRECISION, run=RUN, layer=LAYER, step=snapshot["step"])
        shown = _shown_table(panel)
        assert shown == _served_table(layer)
        assert {name for name, row in shown.items() if row["flagged"]} == flagged
        panel.locator("table.precision-table").screenshot(
            path=str(artifacts_dir() / "precision_panel.png")
        )


def test_the_precision_panel_names_a_layer_only_once_its_table_is_drawn(
    browser,  # noqa: F811
    mixed_run,
):
    """While the new layer's series are held back, the panel keeps the previous layer's marker
    and table; once they are answered, the marker names the new layer and the table is its."""
    url, snapshot = mixed_run
    with gradviz_page(browser, url) as page:
        frame = tab(page)
        # The layer the tab opens on (a max pool), once its panel is drawn.
        panel = wait_drawn(frame, PRECISION, run=RUN, step=snapshot["step"])
        first = json.loads(panel.get_attribute("data-drawn"))["layer"]
        assert first != LAYER
        assert _shown_table(panel) == _served_table(_layer(snapshot, first))
        held = HeldRequests(page, lambda url: "/series?" in url and f"layer={LAYER}&" in url)
        frame.get_by_label("Layer", exact=True).select_option(LAYER)
        held.wait()
        assert panel.get_attribute("data-drawn") == (
            f'{{"layer":"{first}","run":"{RUN}","step":{snapshot["step"]}}}'
        )
        assert _shown_table(panel) == _served_table(_layer(snapshot, first))
        held.release()
        wait_drawn(frame, PRECISION, run=RUN, layer=LAYER, step=snapshot["step"])
        assert _shown_table(panel) == _served_table(_layer(snapshot, LAYER))
