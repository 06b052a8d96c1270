"""Imports point one way between the package's layers (README "Layout", ARCHITECTURE's rules).

Every ``import`` in the package is read with :mod:`ast` -- those inside functions too, since a
lazy import is still a dependency -- and checked against what its layer may not import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import jupyter_gpusched

PACKAGE = Path(jupyter_gpusched.__file__).parent
LAYERS = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())

#: What each layer must not import: our layers by folder name, other packages by top name.
FORBIDDEN: dict[str, set[str]] = {
    # the shared bottom: plain data, pure rules, a clock passed in
    "core": {*LAYERS} - {"core"} | {"asyncssh", "sqlalchemy", "tornado", "jupyter_server"},
    # the pure packer: plain data in, placements out; no I/O, no asyncio
    "packing": {*LAYERS} - {"core", "packing"}
    | {"asyncio", "asyncssh", "sqlalchemy", "tornado", "jupyter_server"},
    # what runs on a GPU node: the standard library, ipykernel and core's plain helpers
    "node": {*LAYERS} - {"core", "node"},
    # backends hand plain data to the scheduler and know nothing above them
    "cluster": {"packing", "store", "scheduling", "leases", "batch", "server", "client", "cli"},
    "store": {"packing", "scheduling", "cluster", "leases", "batch", "server", "client", "cli"},
    "scheduling": {"leases", "batch", "server", "client", "cli"},
    "leases": {"server", "client", "cli"},
    "batch": {"server", "client", "cli"},
    "server": {"client", "cli"},
    # clients speak only the REST/websocket API
    "client": {"packing", "store", "scheduling", "cluster", "leases", "batch", "server"},
    # the CLI is commands only: what runs a scheduler is composed beside the server
    "cli": {"store", "scheduling", "cluster"},
}


def _module_name(path: Path) -> tuple[str, bool]:
    """Dotted name of a module file, and whether it is a package's ``__init__``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file."""
    module, is_package = _module_name(path)
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def _target(name: str) -> str:
    """The layer (or other package) an imported module belongs to."""
    parts = name.split(".")
    if parts[0] == PACKAGE.name:
        return parts[1] if len(parts) > 1 else PACKAGE.name
    return parts[0]


def test_every_layer_has_a_rule() -> None:
    assert sorted(FORBIDDEN) == LAYERS


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_it_must_not(layer: str) -> None:
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for line, name in _imports(path)
        if _target(name) in FORBIDDEN[layer]
    ]
    assert not wrong, "\n".join(wrong)
