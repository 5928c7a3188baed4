"""Runs the frontend's pure-logic unit tests (`node --test`) as part of pytest."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent / "frontend"


def test_frontend_unit_tests_pass_under_node():
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is not on PATH; the frontend unit tests need Node.js 18+")
        pytest.skip("node is not on PATH")
    files = sorted(str(p) for p in TESTS.glob("*.test.mjs"))
    assert files, f"no *.test.mjs under {TESTS}"
    result = subprocess.run([node, "--test", *files], capture_output=True, text=True, timeout=120)
    summary = [line for line in result.stdout.splitlines() if line.startswith(("# pass", "# fail"))]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert summary and summary[0].split()[-1] != "0" and summary[1] == "# fail 0", summary
