"""The import table of docs/architecture.md, enforced: every module of ``companion`` is parsed and
each of its imports (module level, ``TYPE_CHECKING`` blocks and function bodies alike) is checked
against the layer it belongs to.

A name imported from a package (``from companion.actions import ActionDef``) counts as an import
of the submodule that defines it, as the package's ``__init__`` re-exports it: the table is about
what a module uses, not about which facade it went through.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "companion"

# --- the table (keep it the same as docs/architecture.md) ------------------------------------

LAYERS: dict[str, tuple[str, ...]] = {
    # layer: the modules in it (a name covers the module or package and everything under it)
    "vocabulary": (
        "companion.protocol",
        "companion.ports",
        "companion.log",
        "companion.timings",
        "companion.bind",
        "companion.lazy",
        "companion.text",
    ),
    "core": (
        "companion.card",
        "companion.conversation",
        "companion.lines",
        "companion.node.membership",
        "companion.node.announcements",
        "companion.actions.approval",
        "companion.actions.builtins",
        "companion.actions.catalog",
        "companion.actions.context",
        "companion.actions.definition",
        "companion.actions.progress",
        "companion.actions.registry",
        "companion.actions.results",
        "companion.models.base",
        "companion.models.errors",
    ),
    "state": ("companion.store", "companion.node.trust"),
    "tasks": ("companion.tasks",),
    "memory": ("companion.memory",),
    "engine": (
        "companion.engine",
        "companion.actions",  # the package's __init__: it re-exports the runtime
        "companion.actions.runtime",
        "companion.actions.queries",
    ),
    "models": ("companion.models",),
    "node": ("companion.node",),
    "bridge": ("companion.bridge",),
    "voice": ("companion.voice",),
    "rtc": ("companion.rtc",),
    "listen": ("companion.listen",),
    "app": ("companion.app",),
    "cli": ("companion.cli", "companion.__main__"),
    "testing": ("companion.testing",),
    "package": ("companion",),  # the package's __init__ alone: the front door
}

MAY_IMPORT: dict[str, frozenset[str]] = {
    # layer: the other layers its modules may import (its own is always allowed)
    "vocabulary": frozenset(),
    "core": frozenset({"vocabulary"}),
    "state": frozenset({"vocabulary", "core"}),
    "tasks": frozenset(),
    "memory": frozenset({"vocabulary", "tasks"}),
    "engine": frozenset({"vocabulary", "core", "state", "tasks"}),
    "models": frozenset({"vocabulary", "core", "tasks"}),
    "node": frozenset({"vocabulary", "core", "state", "memory"}),
    "bridge": frozenset({"vocabulary", "core", "memory"}),
    "voice": frozenset({"vocabulary"}),
    "rtc": frozenset({"vocabulary", "core", "memory", "bridge", "voice", "tasks"}),
    "listen": frozenset({"vocabulary", "core", "bridge", "rtc", "voice"}),
    "app": frozenset(LAYERS) - {"app", "cli", "testing"},
    "cli": frozenset({"vocabulary", "core", "app", "package", "tasks"}),
    "testing": frozenset({"vocabulary", "core", "state", "memory", "models"}),
    "package": frozenset({"vocabulary", "core"}),
}

EXCEPTIONS: dict[tuple[str, str], str] = {
    # (importing module, imported module): why this edge is allowed although the table is not
    ("companion.node.membership", "companion.node.trust"): (
        "membership decides over the TrustStore it is handed (synchronous calls); the file "
        "behind it is the store's business"
    ),
    ("companion.actions.context", "companion.store.kv"): (
        "a handler's ctx.store is a kv Namespace (a type only: the store loads when a runtime opens it)"
    ),
    ("companion.bridge.actions", "companion.actions.runtime"): (
        "POST /actions/TOOL runs a tool through the companion's ActionRuntime, which app/run.py "
        "hands to the bridge"
    ),
    ("companion.conversation.signals", "companion.models.lexicon"): (
        "clients and the demo's transcript clean peers' text with the same function the scripted model uses"
    ),
}

NO_EVENT_LOOP = frozenset(
    {"trio", "anyio", "asyncio", "libp2p", "multiaddr", "aiortc", "av", "trio_websocket", "httpx", "socket"}
)
"""What the vocabulary and the core never import: they are synchronous and touch no network (the
shell calls them)."""
PURE_LAYERS = frozenset({"vocabulary", "core"})
EVENT_LOOPS = ("trio", "anyio", "asyncio", "libp2p", "aiortc", "trio_websocket", "httpx")
"""What importing the sans-IO core must not load (``socket`` is left out: the standard library
loads it for its own reasons)."""

# --- reading the code -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Import:
    module: str
    """The importing module."""
    target: str
    """The imported module (a name from a package resolved to the submodule defining it)."""
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    """The layer of the longest name in :data:`LAYERS` that is ``module`` or a package above it."""
    best, best_len = None, -1
    for layer, names in LAYERS.items():
        for name in names:
            covers = module == name or (name != "companion" and module.startswith(name + "."))
            if covers and len(name) > best_len:
                best, best_len = layer, len(name)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py: add it to LAYERS")
    return best


@cache
def reexports(package: str) -> dict[str, str]:
    """Name -> the submodule it comes from, for the names a package's ``__init__`` imports."""
    init = PACKAGE.parent.joinpath(*package.split("."), "__init__.py")
    if not init.exists():
        return {}
    names: dict[str, str] = {}
    # ast.walk: a name exported lazily (PEP 562 ``__getattr__``) is imported for type checkers in
    # an ``if TYPE_CHECKING:`` block, which says where it comes from
    for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            source = resolve_from(package, True, node)
            for alias in node.names:
                names[alias.asname or alias.name] = source
    return names


def resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = resolve_from(module, is_package, node)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in modules:  # from companion import conversation
                    found.append(Import(module, sub, node.lineno))
                elif source in modules and source != module:
                    found.append(Import(module, reexports(source).get(alias.name, source), node.lineno))
                else:
                    found.append(Import(module, source, node.lineno))
    return found


def violations() -> list[str]:
    modules = all_modules()
    out: list[str] = []
    for module, path in modules.items():
        layer = layer_of(module)
        for imp in imports_of(module, path, modules):
            top = imp.target.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{imp.line}"
            if top != "companion":
                if layer in PURE_LAYERS and top in NO_EVENT_LOOP:
                    out.append(
                        f"{where}: {module} ({layer}) imports {imp.target}: the {layer} layer is "
                        "synchronous and touches no network (it may not import "
                        f"{', '.join(sorted(NO_EVENT_LOOP))})"
                    )
                continue
            target_layer = layer_of(imp.target)
            if target_layer == layer or target_layer in MAY_IMPORT[layer]:
                continue
            if (module, imp.target) in EXCEPTIONS:
                continue
            allowed = ", ".join(sorted(MAY_IMPORT[layer])) or "nothing else"
            out.append(
                f"{where}: {module} ({layer}) imports {imp.target} ({target_layer}): "
                f"the {layer} layer may import only {allowed} (docs/architecture.md)"
            )
    return out


# --- the tests ------------------------------------------------------------------------------


def test_every_import_follows_the_layer_table() -> None:
    found = violations()
    assert not found, "imports that break the layer table:\n" + "\n".join(found)


def test_every_module_is_in_a_layer() -> None:
    for module in all_modules():
        layer_of(module)  # raises naming the module


def test_every_exception_is_still_needed() -> None:
    """An exception whose import is gone, or that the table allows anyway, is taken out."""
    modules = all_modules()
    edges = {(i.module, i.target) for m, p in modules.items() for i in imports_of(m, p, modules)}
    for module, target in EXCEPTIONS:
        assert (module, target) in edges, f"{module} no longer imports {target}: drop the exception"
        assert layer_of(target) not in MAY_IMPORT[layer_of(module)], f"{module} -> {target} is allowed"


def test_the_table_matches_the_document() -> None:
    """docs/architecture.md lists each layer's modules and what it may import, as here."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for layer, names in LAYERS.items():
        allowed = " ".join(f"`{n}`" for n in sorted(MAY_IMPORT[layer])) or "nothing"
        assert f"| `{layer}` |" in doc, f"layer {layer} is missing from docs/architecture.md"
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{layer}` |"))
        assert row.rstrip().endswith(f"| {allowed} |"), f"{layer}: the document says {row!r}"
        for name in names:
            short = name.removeprefix("companion.").replace(".", "/") or "companion"
            assert f"`{short}`" in row, f"{name} is missing from the {layer} row of docs/architecture.md"
    for module, target in EXCEPTIONS:
        assert f"`{module}` → `{target}`" in doc, f"exception {module} -> {target} is not documented"


def test_a_forbidden_import_is_reported(tmp_path: Path) -> None:
    """The checker finds a function-level import from the shell into the pure core."""
    path = tmp_path / "conversation.py"
    path.write_text("def f() -> None:\n    from companion.node import CompanionNode\n", encoding="utf-8")
    found = imports_of("companion.conversation.machine", path, all_modules())
    assert [(i.target, i.line) for i in found] == [("companion.node.node", 2)]
    assert layer_of("companion.node.node") not in MAY_IMPORT[layer_of("companion.conversation.machine")]


@pytest.mark.parametrize(
    "module",
    [
        "companion.conversation.machine",
        "companion.conversation.transcript",
        "companion.conversation.rules",
        "companion.node.membership",
        "companion.node.announcements",
        "companion.card.model",
        "companion.lines.check",
    ],
)
def test_the_sans_io_core_loads_no_event_loop(module: str) -> None:
    """Importing the state machine and its rule book starts neither trio nor libp2p (a facade's
    ``__init__`` could pull them in although every import follows the table)."""
    code = f"import sys, {module}; print(sorted(m for m in {EVENT_LOOPS!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"importing {module} loads {out.stdout.strip()}"
