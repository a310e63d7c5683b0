"""The import graph of app/ (every import, lazy and type-only ones too) points only down:
engine <- chat <- serve <- ui, with bench beside ui and the command line on top."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "app"
# What each package may import besides itself (the command line, app/*.py, may import anything).
ALLOWED = {
    "app.engine": set(),
    "app.chat": {"app.engine"},
    "app.serve": {"app.engine", "app.chat"},
    "app.ui": {"app.engine.api", "app.chat", "app.serve"},
    "app.bench": {"app.engine", "app.chat", "app.serve"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, run_time_only: bool = False) -> set[str]:
    """Every app module `path` imports, wherever the import sits in the file (run_time_only: not
    those under `if TYPE_CHECKING:`, which never run)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                 for statement in block.body for node in ast.walk(statement)} if run_time_only else set()
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from . import x` names a module x; `from .m import f` names m
            found |= {f"{module}.{alias.name}" for alias in node.names} if not node.module else {module}
    return {module for module in found if module == "app" or module.startswith("app.")}


def graph(run_time_only: bool = False) -> dict[str, set[str]]:
    modules = {module_name(path): path for path in APP.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        # `from .lowbit import kernel` names a module; `from .x import function` names x
        edges[name] = {target if target in modules else target.rsplit(".", 1)[0]
                       for target in imports(path, run_time_only)}
    return edges


def layer(module: str) -> str | None:
    return next((package for package in ALLOWED if module == package or module.startswith(package + ".")), None)


def test_layers_point_only_down():
    wrong = []
    for module, targets in graph().items():
        own = layer(module)
        if own is None:
            continue  # the command line
        for target in targets:
            if target == own or target.startswith(own + ".") or target == "app":
                continue
            if not any(target == allowed or target.startswith(allowed + ".") for allowed in ALLOWED[own]):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def cycles_in(edges: dict[str, set[str]], layers: tuple[str, ...]) -> list[str]:
    """Each circle of imports among the modules of one of `layers`."""
    cycles = []
    for start in edges:
        if layer(start) not in layers:
            continue
        stack, seen = [(start, [start])], set()
        while stack:
            module, path = stack.pop()
            for target in edges.get(module, ()):
                if target == start:
                    cycles.append(" -> ".join(path + [start]))
                elif target not in seen and layer(target) == layer(start):
                    seen.add(target)
                    stack.append((target, path + [target]))
    return sorted(set(cycles))


def test_no_import_cycles_above_the_engine():
    cycles = cycles_in(graph(run_time_only=True), ("app.bench", "app.chat", "app.ui", "app.serve"))
    assert not cycles, "\n".join(cycles)


def test_the_windows_helpers_import_no_circle_not_even_for_their_types():
    """The window's helpers take the controller and the widgets they need (or a Protocol naming
    them), never MainWindow: the ui's imports, type-only ones included, have no circle."""
    cycles = cycles_in(graph(), ("app.ui",))
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("engine_module", ["app.engine.api"])
def test_the_window_sees_the_engine_only_through_its_api(engine_module):
    used = {target for module, targets in graph().items() if layer(module) == "app.ui"
            for target in targets if layer(target) == "app.engine"}
    assert used <= {engine_module}, used


def test_the_checks_above_can_fail():
    """The graph sees a lazy import inside a function, and the rules refuse an upward one."""
    chat_module = APP / "chat" / "session.py"
    assert "app.engine.choices" in imports(chat_module) or "app.engine.api" in imports(chat_module)
    window = APP / "ui" / "main_window.py"
    assert any(target.startswith("app.chat") for target in imports(window))
    # the chat session names the engine for its types only
    assert "app.engine.engine" in imports(chat_module) and "app.engine.engine" not in imports(chat_module, True)
    assert cycles_in({"app.ui.a": {"app.ui.b"}, "app.ui.b": {"app.ui.a"}}, ("app.ui",))
    assert layer("app.engine.loop") == "app.engine" and not ALLOWED["app.engine"]
