"""The lab's tools still name what the product has: every ``from gdnzoo... import X`` and
``import gdnzoo...`` in ``lab/*.py`` resolves, and so does every attribute read of a product
module it imported (``vb.verify_ctx`` after ``from gdnzoo.bench import mode_verify as vb``; read
from the source, nothing of the lab run or imported).  A refactor of the product that renames
a module or a function a lab tool uses fails here, not on a lent GPU (lab/verify_ab.py and
lab/host_breakdown.py each failed on import there after the house refactor).  The notebook's scripts are records of their day, not checked."""
import ast
import importlib
import inspect
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1] / "lab"
PRODUCT = ("gdnzoo",)


def _tree(path):
    return ast.parse(path.read_text(), str(path))


def _imports(tree):
    """(line, module, name or None) of every product import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in PRODUCT:
            for alias in node.names:
                yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PRODUCT:
                    yield node.lineno, alias.name, None


def _resolves(module, name) -> str:
    """'' when ``from module import name`` (``import module`` for None) would work, else why."""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return f"{module}: {e}"
    if name is None or name == "*" or hasattr(mod, name):
        return ""
    try:
        importlib.import_module(f"{module}.{name}")
        return ""
    except ImportError:
        return f"{module} has no {name}"


def _module_names(tree) -> dict:
    """name -> the product module it is bound to in ``tree`` (``import gdnzoo.x as y``,
    ``from gdnzoo.x import module as y``, ``import gdnzoo``), where that import resolves."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PRODUCT and not _resolves(alias.name, None):
                    bound[alias.asname or alias.name.split(".")[0]] = importlib.import_module(
                        alias.name if alias.asname else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] in PRODUCT:
            for alias in node.names:
                if alias.name != "*" and not _resolves(node.module, alias.name):
                    x = getattr(importlib.import_module(node.module), alias.name, None)
                    if x is None:
                        x = importlib.import_module(f"{node.module}.{alias.name}")
                    if inspect.ismodule(x):
                        bound[alias.asname or alias.name] = x
    return bound


def _attribute_reads(tree):
    """(line, name, attribute) of every ``name.attribute`` read in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and \
                isinstance(node.value, ast.Name):
            yield node.lineno, node.value.id, node.attr


def problems(path) -> list:
    tree = _tree(path)
    bad = [f"{path.name}:{line}: {why}" for line, module, name in _imports(tree)
           for why in [_resolves(module, name)] if why]
    mods = _module_names(tree)
    bad += [f"{path.name}:{line}: {mods[name].__name__} has no {attr} ({name}.{attr})"
            for line, name, attr in _attribute_reads(tree)
            if name in mods and not hasattr(mods[name], attr)]
    return bad


@pytest.mark.parametrize("path", sorted(LAB.glob("*.py")), ids=lambda p: p.name)
def test_every_product_name_a_lab_tool_reads_resolves(path):
    bad = problems(path)
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_stale_import(tmp_path):
    """A name the product does not have (the pre-refactor ``gdnzoo.bench.pool``, a function
    ``mode_verify`` no longer has) is reported; an attribute the lab assigns is not a read."""
    f = tmp_path / "stale.py"
    f.write_text("from gdnzoo.bench import pool\nfrom gdnzoo.checks import signature\n"
                 "import gdnzoo.no_such_module\n")
    got = [_resolves(m, n) for _, m, n in _imports(_tree(f))]
    assert got[0] == "gdnzoo.bench has no pool" and got[1] == ""
    assert got[2].startswith("gdnzoo.no_such_module")
    g = tmp_path / "attrs.py"
    g.write_text("from gdnzoo.bench import mode_verify as vb\nimport gdnzoo.checks\n"
                 "vb.verify_ctx\nvb.make_ctx(1)\ngdnzoo.checks.signature\nvb.x = 1\n")
    assert problems(g) == ["attrs.py:4: gdnzoo.bench.mode_verify has no make_ctx (vb.make_ctx)"]
