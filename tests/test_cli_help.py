"""`tb-gradviz --help` and each command's: flag names never broken across lines, and the demo
described as it is."""

import re

import pytest

from tb_gradviz import cli
from tb_gradviz.format import health, leading


def help_text(monkeypatch, capsys, width, *command):
    monkeypatch.setenv("COLUMNS", str(width))
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args([*command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def words(text):
    return [word for line in text.splitlines() for word in re.findall(r"[\w-]+", line)]


@pytest.mark.parametrize("command", [(), ("demo",), ("summary",), ("export",), ("check",)])
def test_help_never_breaks_a_flag_name_or_a_word_across_lines(monkeypatch, capsys, command):
    # At 80 columns `check --help` printed "dead,und" / "erflow" and "update_spik" / "e".
    whole = words(help_text(monkeypatch, capsys, 1000, *command))
    for width in range(40, 141, 10):
        assert words(help_text(monkeypatch, capsys, width, *command)) == whole, width


def test_check_help_names_every_flag_and_warning_whole_at_80_columns(monkeypatch, capsys):
    found = set(words(help_text(monkeypatch, capsys, 80, "check")))
    assert set(health.FLAGS + leading.WARNINGS) <= found
    assert {"--fail-on", "comma-separated"} <= found


def test_top_level_help_says_the_demo_trains_its_nine_runs(monkeypatch, capsys):
    pytest.importorskip("keras")  # demos imports it
    from tb_gradviz import demos

    text = " ".join(help_text(monkeypatch, capsys, 100).split())
    plan = demos.demo_plan("all")
    assert len(plan) == 9
    assert "demo train nine demo runs with the callback" in text, text
    assert "ResNet50 and a small CNN" not in text
