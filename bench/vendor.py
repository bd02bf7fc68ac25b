"""Vendoring for `gdnzoo pack`: copy a gdnzoo module, every gdnzoo module it imports (transitively)
and the data files they name into a relocatable package, with ``gdnzoo.*`` imports made relative.

Refuses (``PackError``) what it cannot relocate faithfully: ``import gdnzoo.x`` without ``as``,
dynamic imports of gdnzoo modules by name, names imported from a package ``__init__``, imports
sharing a line with other code.
"""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

VENDOR = "gdnzoo_vendored"
_DATA_SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".cpp", ".c", ".ptx", ".txt", ".json", ".yaml"}


class PackError(RuntimeError):
    """The backend cannot be vendored as is; the message says what and where."""


def _is_pkg(modname: str) -> bool:
    spec = importlib.util.find_spec(modname)
    return bool(spec and spec.submodule_search_locations is not None)


def _gdnzoo_imports(tree, modname: str):
    """(node, [target modules]) for every import of a gdnzoo module anywhere in the file."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "gdnzoo" or node.module.startswith("gdnzoo.")):
            targets = [node.module]
            if _is_pkg(node.module):  # `from gdnzoo.backends import x` names a submodule
                for al in node.names:
                    sub = f"{node.module}.{al.name}"
                    if importlib.util.find_spec(sub) is None:
                        raise PackError(f"{modname}: line {node.lineno}: imports {al.name!r} from "
                                        f"package {node.module}'s __init__, which is not vendored")
                    targets.append(sub)
            found.append((node, targets))
        elif isinstance(node, ast.Import):
            for al in node.names:
                if al.name == "gdnzoo" or al.name.startswith("gdnzoo."):
                    if al.asname is None or len(node.names) != 1:
                        raise PackError(f"{modname}: line {node.lineno}: `import {al.name}` without "
                                        f"`as` cannot be made relative; use `from ... import`")
                    found.append((node, [al.name]))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.fullmatch(r"gdnzoo(\.\w+)+", node.value):
            raise PackError(f"{modname}: line {node.lineno}: dynamic import of {node.value!r} "
                            f"cannot be vendored")
    return found


def _relative(node, target_pkg_level: int, indent: str) -> str:
    dots = "." * target_pkg_level
    if isinstance(node, ast.ImportFrom):
        rest = node.module[len("gdnzoo"):].lstrip(".")
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
        return f"{indent}from {dots}{rest} import {names}"
    al = node.names[0]
    parent, _, leaf = al.name.rpartition(".")
    rest = parent[len("gdnzoo"):].lstrip(".")
    return f"{indent}from {dots}{rest} import {leaf} as {al.asname}"


def _rewrite(src: str, modname: str, imports) -> str:
    lines = src.splitlines(keepends=True)
    pkg = modname if _is_pkg(modname) else modname.rpartition(".")[0]
    level = len(pkg.split("."))      # dots from this module's package up to the vendor root
    for node, _ in sorted(imports, key=lambda t: -t[0].lineno):
        first, last = node.lineno - 1, node.end_lineno - 1
        head = lines[first]
        indent = head[:len(head) - len(head.lstrip())]
        if node.col_offset != len(indent) or lines[last].rstrip("\n")[node.end_col_offset:].strip():
            raise PackError(f"{modname}: line {node.lineno}: an import sharing its line with other "
                            f"code cannot be rewritten")
        lines[first:last + 1] = [_relative(node, level, indent) + "\n"]
    return "".join(lines)


def _data_files(tree, base: Path):
    """Files next to a module that its string literals name (e.g. 'cuda_v4.cu'), with includes;
    one found in the folder above instead (registry.yaml: beside the installed package, at a
    source checkout's root) is vendored beside the module too, so that a Solution is the same
    from a wheel and from a checkout."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                0 < len(node.value) < 200 and "\n" not in node.value:
            for cand in (base / node.value, base.parent / node.value):
                try:
                    ok = cand.is_file() and cand.suffix in _DATA_SUFFIXES
                except (OSError, ValueError):
                    ok = False
                if ok:
                    out[cand.resolve()] = node.value
                    break
    todo = list(out)
    while todo:
        f = todo.pop()
        if f.suffix not in {".cu", ".cuh", ".h", ".hpp", ".cpp", ".c"}:
            continue
        for inc in re.findall(r'#\s*include\s*"([^"]+)"', f.read_text()):
            g = (f.parent / inc).resolve()
            if g.is_file() and g not in out:
                out[g] = str(Path(out[f]).parent / inc)
                todo.append(g)
    return out


def _package_data(tree):
    """{file: relative path under the vendor root} of the globs a module lists in a top-level
    ``PACKAGE_DATA = (...)`` (paths relative to the gdnzoo package, whose first part may be a
    subpackage mapped elsewhere, as ``backends/``)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PACKAGE_DATA"
                                                for t in node.targets):
            for pattern in ast.literal_eval(node.value):
                head, _, rest = pattern.partition("/")
                spec = importlib.util.find_spec(f"gdnzoo.{head}")
                if spec is None or not spec.submodule_search_locations:
                    raise PackError(f"PACKAGE_DATA {pattern!r}: gdnzoo.{head} is not a package")
                base = Path(list(spec.submodule_search_locations)[0])
                for f in sorted(base.glob(rest)):
                    out[f.resolve()] = str(Path(head, f.relative_to(base)))
    return out


def vendor(modname: str) -> dict:
    """{relative path: text} of ``modname`` and its gdnzoo imports, under ``gdnzoo_vendored/``."""
    files, seen, todo = {}, set(), [modname]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        spec = importlib.util.find_spec(m)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise PackError(f"cannot locate the source of module {m}")
        path = Path(spec.origin)
        src = path.read_text()
        tree = ast.parse(src)
        imports = _gdnzoo_imports(tree, m)
        for _, targets in imports:
            todo.extend(t for t in targets if t != "gdnzoo" and not _is_pkg(t))
        parts = m.split(".")[1:]
        if _is_pkg(m):
            raise PackError(f"{m}: a package's __init__ is not vendored; import its modules")
        rel = Path(VENDOR, *parts[:-1], parts[-1] + ".py")
        files[str(rel)] = _rewrite(src, m, imports)
        for f, name in _data_files(tree, path.parent).items():
            files[str(Path(VENDOR, *parts[:-1], name))] = f.read_text()
        for f, rel in _package_data(tree).items():
            files[str(Path(VENDOR, rel))] = f.read_text()
    for d in {d for p in files for d in Path(p).parents if str(d) not in (".", "")}:
        files.setdefault(str(d / "__init__.py"), '"""Vendored from gdnzoo by `gdnzoo pack`."""\n')
    return files
