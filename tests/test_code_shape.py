"""The code's shape, kept by the suite: small modules, small functions, no import cycles.

Import cycles are counted over every import statement, function-local ones included (a local
import that goes back up the layers hides a cycle that import-linter's module-level graph does not
show). The layers themselves are the import-linter contracts in pyproject.toml (tests/test_layers.py).
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rmfast"
MAX_MODULE_LINES = 650
MAX_FUNCTION_LINES = 80  # code lines: the docstring is not counted; kernels (one fused function each) exempt


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if pkg else parts)] = (p, pkg)
    return out


def _imports(name: str, path: Path, pkg: bool, mods: dict) -> set[str]:
    """The rmfast modules ``name`` imports anywhere in its body (a submodule where one is named)."""

    def known(t: str) -> str:
        while t not in mods and "." in t:
            t = t.rsplit(".", 1)[0]
        return t

    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out |= {known(a.name) for a in n.names if a.name.split(".")[0] == "rmfast"}
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = name.split(".") if pkg else name.split(".")[:-1]
                base = base[: len(base) - (n.level - 1)] if n.level > 1 else base
                target = ".".join(base + ([n.module] if n.module else []))
            elif (n.module or "").split(".")[0] == "rmfast":
                target = n.module
            else:
                continue
            out |= {f"{target}.{a.name}" if f"{target}.{a.name}" in mods else known(target) for a in n.names}
    out.discard(name)
    return out


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_over_650_lines():
    big = {str(p.relative_to(SRC)): n for p, _ in _modules().values()
           if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {big}"


def _code_lines(fn: ast.FunctionDef) -> int:
    body = fn.body
    doc = body[0] if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
        and isinstance(body[0].value.value, str) else None
    n = fn.end_lineno - fn.lineno + 1
    return n - (doc.end_lineno - doc.lineno + 1 if doc is not None else 0)


def test_no_function_over_80_code_lines_outside_kernels():
    big = {}
    for p, _ in _modules().values():
        if "kernels" in p.parts:
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(n) > MAX_FUNCTION_LINES:
                big[f"{p.relative_to(SRC)}:{n.name}"] = _code_lines(n)
    assert not big, f"functions over {MAX_FUNCTION_LINES} code lines (docstring not counted): {big}"


def test_no_import_cycles_counting_local_imports():
    mods = _modules()
    edges = {m: _imports(m, p, pkg, mods) for m, (p, pkg) in mods.items()}
    assert not _cycles(edges), f"import cycles: {_cycles(edges)}"


def test_the_cycle_finder_finds_a_local_import_cycle(tmp_path):
    """The guard above can fail: a function-local import back up the layers is a cycle."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    (tmp_path / "m.py").write_text("def f():\n    from rmfast.cli import main\n")
    mods = {"rmfast.cli": (tmp_path / "x.py", True), "rmfast.m": (tmp_path / "m.py", False)}
    assert _imports("rmfast.m", tmp_path / "m.py", False, mods) == {"rmfast.cli"}


def test_compile_and_engine_help_say_what_auto_does():
    """The options' help follows the plan: ``--compile auto`` compiles on the CPU kinds in
    COMPILE_CPU_KINDS (it once said "auto = off"), and no message advises the old engine name."""
    import argparse

    from rmfast.cli.common import add_plan_args
    from rmfast.scoring.plan import COMPILE_CPU_KINDS

    p = argparse.ArgumentParser()
    add_plan_args(p)
    text = p.format_help()
    assert "= off" not in text
    assert all(kind in text for kind in COMPILE_CPU_KINDS)
    src = Path(__file__).resolve().parents[1] / "src" / "rmfast"
    stale = [str(f) for f in src.rglob("*.py") if "--engine reference" in f.read_text()]
    assert not stale, stale
