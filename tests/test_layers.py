"""The package is layered: every module sits on a floor and imports only from its own floor or below,
and no modules import each other, directly or through a circle.

The import graph is read from the source with ``ast``, imports inside functions included. Imports
under ``if TYPE_CHECKING:`` are left out: they are never executed, they only name types for
annotations. Importing ``a.b`` also runs ``a/__init__.py``, so an import of ``feddr_kit.methods.base``
from outside ``methods/`` counts as an import of ``feddr_kit.methods`` too. The package face
``feddr_kit/__init__.py`` re-exports and is on no floor. A new module must be placed in FLOORS.
"""
import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "feddr_kit"
ROOT = "feddr_kit"

FLOORS = {
    1: ["errors", "losses", "probes", "heads", "streams", "instruments", "progress", "repo"],  # pure: tensors in, tensors out; progress display; where the repository is
    2: ["data", "partition", "models", "stats", "paper", "rundir", "tblog", "workers"],  # data, models, statistics, the run's folder; tasks in processes side by side
    3: ["clients", "schedule", "local", "evaluation"],  # who holds what; the server's schedule; one client; evaluation
    4: ["methods.base"],  # what a method is: Algorithm and the registry
    5: ["methods.global_fl", "methods.baselines", "methods.personalized", "methods", "algorithms"],  # the methods
    6: ["config", "engine"],  # the validated config (asks the registry); serial or batched rounds
    7: ["build"],  # the one seeded build of a run
    8: ["roundlog"],  # the record of a run
    9: ["federated"],  # the round loop
    10: ["personalize", "sweep", "teaching", "flower_run", "flower", "export",  # what is built on runs; sweeps:
         "sweep_grid", "sweep_root", "claims", "sweep_collect", "sweep_notebooks", "sweep_run", "sweep_cli"],  # sweep.py is their face
    11: ["plots", "show", "__main__"],  # figures, results shown, the command line
}
FLOOR = {f"{ROOT}.{m}": floor for floor, names in FLOORS.items() for m in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported(module: str) -> set[str]:
    """The package modules ``module`` imports when it runs (the parent packages they make Python import included)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import engine` imports a module
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    targets = set()
    for name in found:
        if name not in MODULES or name == module:
            continue
        targets.add(name)
        parts = name.split(".")
        for i in range(2, len(parts)):  # parent packages, except the face and the importer's own packages
            parent = ".".join(parts[:i])
            if not (module == parent or module.startswith(parent + ".")):
                targets.add(parent)
    targets.discard(ROOT)
    return targets


GRAPH = {m: imported(m) for m in MODULES if m != ROOT}


def test_every_module_is_placed_on_a_floor():
    unplaced = sorted(set(GRAPH) - set(FLOOR))
    assert not unplaced, f"place these modules in FLOORS: {unplaced}"
    assert not sorted(set(FLOOR) - set(GRAPH)), "FLOORS names modules that do not exist"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_module_imports_only_its_floor_or_below(module):
    upward = sorted(t for t in GRAPH[module] if FLOOR.get(t, 0) > FLOOR.get(module, 0))
    assert not upward, f"{module} (floor {FLOOR.get(module)}) imports from higher floors: " + \
        ", ".join(f"{t} (floor {FLOOR[t]})" for t in upward)


def test_no_import_circle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(m: str) -> None:
        state[m], _ = 1, path.append(m)
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(t):] + [t]))
            if t not in state:
                walk(t)
        state[m], _ = 2, path.pop()

    for m in sorted(GRAPH):
        if m not in state:
            walk(m)


def test_the_graph_is_read():
    """The reader sees the imports it must see (a guard against a reader that finds nothing)."""
    assert {"feddr_kit.local", "feddr_kit.methods.base", "feddr_kit.methods.global_fl"} <= GRAPH["feddr_kit.methods.personalized"]
    assert "feddr_kit.methods" in GRAPH["feddr_kit.config"]  # imported inside Config.validate
    assert "feddr_kit.methods" in GRAPH["feddr_kit.engine"]  # from .methods.base: methods/__init__ runs first
    assert "feddr_kit.config" not in GRAPH["feddr_kit.local"]  # only under TYPE_CHECKING
