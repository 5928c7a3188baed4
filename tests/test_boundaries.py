"""The package's import boundaries, checked in the source and in a fresh interpreter.

format <- capture <- callback and format <- board <- CLI: the format imports
neither side; the board and the CLI import no deep-learning framework and not
the capture (TensorBoard imports every installed plugin at start, and the
plugin's users may have no framework installed); the package root imports no
framework.
"""

import ast
import pathlib
import subprocess
import sys

import limits
import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tb_gradviz"

FRAMEWORKS = ("tensorflow", "tf_keras", "keras", "jax", "jaxlib", "torch", "numba")

# Imports that a boundary allows inside a function only, each with its reason.
# (importing side, imported module): why.
LAZY_ALLOWED = {
    ("cli", "tb_gradviz.demos"): "`tb-gradviz demo` trains models; only it needs Keras",
    ("root", "tb_gradviz.capture.callback"): "GradVizCallback is loaded on first use",
}


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path):
    """(imported module, at function level) for every import in a file."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if _imports_by_name(child):
                found.append((child.args[0].value, in_function))
            if isinstance(child, ast.Import):
                found.extend((alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                found.append((base, in_function))
                found.extend((f"{base}.{alias.name}", in_function) for alias in child.names)
            visit(child, nested)

    visit(ast.parse(path.read_text(), str(path)), False)
    return module, found


def _imports_by_name(node):
    """Whether `node` imports a module named by a string literal.

    `importlib.import_module("x")`, `__import__("x")`, or a helper whose name
    says it imports (`import_quietly("x")`).
    """
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return False
    callee = (
        node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    )
    return "import" in callee.lower() and isinstance(node.args[0].value, str)


def _within(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


def _side(module):
    if _within(module, "tb_gradviz.format"):
        return "format"
    if _within(module, "tb_gradviz.board"):
        return "board"
    if module == "tb_gradviz.cli" or module.startswith(("tb_gradviz.cli.", "tb_gradviz.cli_")):
        return "cli"
    if module == "tb_gradviz":
        return "root"
    return None


FORBIDDEN = {
    "format": FRAMEWORKS + ("tb_gradviz.capture", "tb_gradviz.board", "tb_gradviz.cli"),
    "board": FRAMEWORKS + ("tb_gradviz.capture", "tb_gradviz.cli", "tb_gradviz.demos"),
    "cli": FRAMEWORKS + ("tb_gradviz.capture", "tb_gradviz.demos"),
    "root": FRAMEWORKS + ("tb_gradviz.capture", "tb_gradviz.demos"),
}


def _violations():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module, imports = _imports(path)
        side = _side(module)
        if side is None:
            continue
        for name, lazy in imports:
            for prefix in FORBIDDEN[side]:
                if not _within(name, prefix):
                    continue
                allowed = any(
                    side == owner and _within(name, target) for owner, target in LAZY_ALLOWED
                )
                if not (lazy and allowed):
                    where = "in a function" if lazy else "at module level"
                    found.append(f"{module} imports {name} {where}")
    return found


def test_the_format_board_cli_and_root_respect_their_import_boundaries():
    assert _violations() == []


def test_the_static_check_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    # The scan must catch what a reviewer would miss: an import inside a
    # function, one by name, and one written relative to the package.
    board = tmp_path / "tb_gradviz" / "board"
    board.mkdir(parents=True)
    (tmp_path / "tb_gradviz" / "__init__.py").write_text("")
    (board / "__init__.py").write_text("")
    (board / "leak.py").write_text(
        "import importlib\n\n"
        "def f():\n    import keras\n\n"
        "def g():\n    return importlib.import_module('torch')\n\n"
        "from ..capture import probe\nfrom . import store\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "tb_gradviz")
    assert _violations() == [
        "tb_gradviz.board.leak imports keras in a function",
        "tb_gradviz.board.leak imports torch in a function",
        "tb_gradviz.board.leak imports tb_gradviz.capture at module level",
        "tb_gradviz.board.leak imports tb_gradviz.capture.probe at module level",
    ]


def test_every_allowed_lazy_import_exists_and_is_inside_a_function():
    # An allow-list entry that no longer matches anything hides nothing, but
    # says something untrue about the code: keep it to what is there.
    for owner, target in LAZY_ALLOWED:
        uses = [
            lazy
            for path in PACKAGE.rglob("*.py")
            for module, imports in [_imports(path)]
            if _side(module) == owner
            for name, lazy in imports
            if _within(name, target)
        ]
        assert uses and all(uses), (owner, target, uses)


@pytest.mark.parametrize(
    "modules",
    [
        ["tb_gradviz"],
        ["tb_gradviz.board.plugin"],
        ["tb_gradviz.cli"],
        ["tb_gradviz.format.records", "tb_gradviz.format.events", "tb_gradviz.format.storage"],
    ],
)
def test_importing_the_read_side_loads_no_framework(modules):
    # A fresh interpreter: this test process has Keras loaded already. Every
    # module of the board and the format is imported too, as is the plugin's
    # entry point, the way TensorBoard loads it at start.
    code = (
        "import importlib, pkgutil, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "import tb_gradviz.board, tb_gradviz.format\n"
        "for package in (tb_gradviz.board, tb_gradviz.format):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "from importlib import metadata\n"
        "(entry,) = [e for e in metadata.entry_points(group='tensorboard_plugins')"
        " if e.name == 'gradviz']\n"
        "entry.load()\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=limits.CHILD_S
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
