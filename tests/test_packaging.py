"""`pip install tb_gradviz` as a new user does it: a built wheel, into a fresh venv."""

import os
import pathlib
import subprocess
import sys
import zipfile

import limits
import pytest

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = """
import sys, warnings, numpy as np, keras, tb_gradviz
assert "GradVizCallback" in dir(tb_gradviz)
m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.MaxPooling2D(name="pool"),
                      keras.layers.Flatten(), keras.layers.Dense(1)])
m.compile("sgd", "mse")
x, y = np.ones((2, 4, 4, 1), "float32"), np.ones((2, 1), "float32")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m.fit(x, y, verbose=0, callbacks=[tb_gradviz.GradVizCallback(sys.argv[1], (x, y))])
print([str(w.message) for w in caught if "numba" in str(w.message)])
print(sorted(os.listdir(sys.argv[1]))[0].startswith("events.out.tfevents."))
print(tb_gradviz.__file__)
""".replace("import sys,", "import os, sys,")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel `pip wheel` builds from this checkout, as a user's install gets it."""
    wheels = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = wheels.glob("tb_gradviz-*.whl")
    return built


def test_the_wheel_holds_every_module_and_the_tab_and_no_test_helper(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    modules = {name for name in names if name.endswith(".py")}
    checkout = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tb_gradviz").rglob("*.py")
        if "__pycache__" not in path.parts
    } | {f"tb_gradviz/board/frontend/{path.name}" for path in (ROOT / "frontend").glob("*.py")}
    assert modules == checkout  # a subpackage missing from pyproject's list would be absent
    test_helpers = {path.name for path in (ROOT / "tests").glob("*.py")} - {"__init__.py"}
    assert "synthetic.py" in test_helpers
    assert not test_helpers & {name.rsplit("/", 1)[-1] for name in modules}
    assert not any(name.startswith("tests/") for name in names)
    assert {"tb_gradviz/board/frontend/index.js", "tb_gradviz/board/frontend/style.css"} <= names
    # TensorBoard loads the plugin through its loader, which keeps the digest whole.
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(wheel) as archive:
        plugins = archive.read(entry_points).decode().split("[tensorboard_plugins]")[1]
    assert plugins.split("\n[")[0].split() == [
        "gradviz",
        "=",
        "tb_gradviz.board.loader:GradVizLoader",
    ]


def test_a_plain_install_without_an_extra_runs_the_callback_on_jax(tmp_path, wheel):
    # No extra: no numba. The callback still works, and says once what to install.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=limits.CHILD_S)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
            "jax",
            "keras",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KERAS_BACKEND")}
    result = subprocess.run(
        [python, "-c", SCRIPT, str(tmp_path / "logs")],
        env=dict(env, KERAS_BACKEND="jax"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warned, wrote, location = result.stdout.strip().split("\n")[-3:]
    assert "numba is not installed" in warned and 'pip install "numba>=0.60"' in warned
    assert wrote == "True"
    assert location.startswith(str(venv))  # the wheel's copy, not this checkout
