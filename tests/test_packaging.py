"""`pip install tb_gradviz` as a new user does it: a built wheel, into a fresh venv."""

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = """
import sys, warnings, numpy as np, keras, tb_gradviz
assert "GradVizCallback" in dir(tb_gradviz)
m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.MaxPooling2D(name="pool"), keras.layers.Flatten(),
                      keras.layers.Dense(1)])
m.compile("sgd", "mse")
x, y = np.ones((2, 4, 4, 1), "float32"), np.ones((2, 1), "float32")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m.fit(x, y, verbose=0, callbacks=[tb_gradviz.GradVizCallback(sys.argv[1], (x, y))])
print([str(w.message) for w in caught if "numba" in str(w.message)])
print(sorted(os.listdir(sys.argv[1]))[0].startswith("events.out.tfevents."))
print(tb_gradviz.__file__)
""".replace("import sys,", "import os, sys,")


def test_a_plain_install_without_an_extra_runs_the_callback_on_jax(tmp_path):
    # No extra: no numba. The callback still works, and says once what to install.
    wheels = tmp_path / "wheels"
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
    (wheel,) = wheels.glob("tb_gradviz-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
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
    assert "numba is not installed" in warned and 'pip install "tb_gradviz[jax]"' in warned
    assert wrote == "True"
    assert location.startswith(str(venv))  # the wheel's copy, not this checkout
