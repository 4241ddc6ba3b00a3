"""preproj's layers import only downwards, and no module imports itself round a cycle.

Every import in src/preproj (function-level ones included) is read with `ast`; an import of a layer above, or of a
sibling at the same height (training and evaluation, core and data, methods and peft), fails with the arrow named."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "preproj"

# Height of each top-level part of the package: a module may import its own part and any part lower down.
LAYERS = {
    "runtime": 0,
    "core": 1, "data": 1,
    "methods": 2, "peft": 2, "standalone": 2, "images": 2, "vision": 2,
    "training": 3, "evaluation": 3,
    "analysis": 4,
    "experiments": 5,
    "cli": 6,
    "__init__": 7,  # the public API re-exports from every layer; nothing inside imports it
    "__main__": 8,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(name: str) -> bool:
    return (SRC.parent / name.replace(".", "/") / "__init__.py").is_file()


def exists(name: str) -> bool:
    return is_package(name) or (SRC.parent / (name.replace(".", "/") + ".py")).is_file()


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported preproj module, whether the import is at module level) for every import in the file."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(tree := ast.parse(path.read_text())):
        at_top = node in tree.body
        if isinstance(node, ast.Import):
            found += [(a.name, at_top) for a in node.names if a.name.split(".")[0] == "preproj"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "preproj":
                continue
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{target}.{alias.name}"
                found.append((sub if exists(sub) else target, at_top))
    return found


def part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


FILES = sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_part_has_a_height():
    assert {part(module_name(p)) if p.name != "__main__.py" else "__main__" for p in FILES} <= set(LAYERS)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down(path):
    me = module_name(path) if path.name != "__main__.py" else "preproj.__main__"
    mine = part(me) if path.name != "__main__.py" else "__main__"
    wrong = []
    for target, _ in imports(path):
        theirs = part(target)
        if theirs == mine:
            continue
        if target == "preproj" or LAYERS[theirs] >= LAYERS[mine]:
            wrong.append(f"{me} -> {target} ({mine} at {LAYERS[mine]}, {theirs} at {LAYERS[theirs]})")
    assert not wrong, "imports that do not point down: " + "; ".join(wrong)


def test_analysis_reads_only_what_tasks_declare():
    """Of evaluation, analysis imports the task declarations (evaluation.tasks: the table, Task, Metric, read_items)
    and nothing else, and those import neither the scoring engine nor the runner."""
    wrong = []
    for path in FILES:
        me = module_name(path)
        for target, _ in imports(path):
            if part(me) == "analysis" and part(target) == "evaluation" and not target.startswith(
                    "preproj.evaluation.tasks"):
                wrong.append(f"{me} -> {target}")
            if me.startswith("preproj.evaluation.tasks") and target in (
                    "preproj.evaluation", "preproj.evaluation.engine", "preproj.evaluation.runner",
                    "preproj.evaluation.harness"):
                wrong.append(f"{me} -> {target}")
    assert not wrong, "; ".join(wrong)


def test_no_import_cycles_at_module_level():
    graph = {module_name(p): {t for t, top in imports(p) if top} for p in FILES if p.name != "__main__.py"}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_checker_sees_an_upward_arrow(tmp_path, monkeypatch):
    """The check itself can fail: a core module that imports training is caught."""
    fake = SRC / "core" / "attach.py"
    text = fake.read_text() + "\nfrom ..training import loop\n"
    monkeypatch.setattr(Path, "read_text",
                        lambda self, *a, **k: text if self == fake else Path.read_bytes(self).decode())
    with pytest.raises(AssertionError, match=r"preproj\.core\.attach -> preproj\.training\.loop"):
        test_imports_point_down(fake)


# "About 60" lines per function and 400 per module: the margin keeps a readable function from failing for a few
# lines; a longer module says why in its docstring ("longer than the others because ...").
FUNCTION_LINES, MODULE_LINES = 70, 400


def test_functions_and_modules_stay_small():
    long_functions, long_modules = [], []
    for path in FILES:
        text = path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.end_lineno - node.lineno >= FUNCTION_LINES):
                long_functions.append(f"{path.relative_to(SRC)}:{node.name} "
                                      f"({node.end_lineno - node.lineno + 1} lines)")
        if (len(text.splitlines()) > MODULE_LINES
                and "longer than the others because" not in " ".join((ast.get_docstring(tree) or "").split())):
            long_modules.append(f"{path.relative_to(SRC)} ({len(text.splitlines())} lines)")
    assert not long_functions and not long_modules, f"split these, or say why: {long_functions + long_modules}"


def test_the_code_passes_its_linter():
    """ruff with the rules pyproject.toml selects (pinned in the test extra, so a new ruff release cannot fail CI)."""
    root = SRC.parents[1]
    code = ["src", "tests", "scripts", "benchmarks", "examples"]
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *code], cwd=root, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
