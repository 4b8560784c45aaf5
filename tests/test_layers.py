"""The package is layered: every module sits on a floor and imports only from its own floor or below,
and no modules import each other, directly or through a circle.

A folder (a subpackage: ``methods/``, ``sweep/``, ``flower/``) is one family on one floor of the package,
named in FLOORS as ``"name/"``, and is layered inside in the same way (FOLDERS): each of its modules imports
from its own folder only on its own inner floor or below, and from the rest of the package only from the
folder's floor or below. Its face, ``__init__.py``, sits above its modules and may re-export any of them.

The import graph is read from the source with ``ast``, imports inside functions included. Imports
under ``if TYPE_CHECKING:`` are left out: they are never executed, they only name types for
annotations. Importing ``a.b`` also runs ``a/__init__.py``, so an import of ``feddr_kit.methods.base``
from outside ``methods/`` counts as an import of ``feddr_kit.methods`` too; a module's own packages
are not counted (they run before it). The package face ``feddr_kit/__init__.py`` re-exports and is on
no floor. A new module must be placed in FLOORS, or in FOLDERS when it is in a folder.
"""
import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "feddr_kit"
ROOT = "feddr_kit"

FLOORS = {
    1: ["errors", "losses", "probes", "heads", "streams", "instruments", "progress", "repo"],  # pure: tensors in, tensors out; progress display; where the repository is
    2: ["data", "partition", "models", "stats", "paper", "rundir", "tblog"],  # data, models, statistics, the run's folder
    3: ["clients", "schedule", "local", "evaluation"],  # who holds what; the server's schedule; one client; evaluation
    4: ["methods/"],  # what a method is (Algorithm and the registry), and the methods
    5: ["algorithms"],  # the methods' names for fk.algorithms
    6: ["config", "engine"],  # the validated config (asks the registry); serial or batched rounds
    7: ["build"],  # the one seeded build of a run
    8: ["roundlog"],  # the record of a run
    9: ["federated"],  # the round loop
    10: ["personalize", "sweep/", "teaching", "flower/", "export"],  # what is built on runs
    11: ["plots", "show", "__main__"],  # figures, results shown, the command line
}

FOLDERS = {  # each folder's floors, from its ground up; its face (__init__) is above them all
    "methods": {1: ["base"],  # Algorithm and the registry
                2: ["global_fl"],  # FedAvg, FedBABU, DR, FedDr+
                3: ["baselines", "personalized"]},  # built on the global methods
    "sweep": {1: ["grid", "workers"],  # the grid's configs and folder names; tasks in processes side by side
              2: ["root"],  # a root's files and each run folder's state
              3: ["claims"],  # claims over seeds
              4: ["collecting"],  # results gathered and tabulated
              5: ["running", "notebooks"],  # a grid of runs; a notebook per grid point
              6: ["cli"]},  # the sweep command
    "flower": {1: ["launch"],  # the App's files and `flwr run` (no Flower import)
               2: ["apps"]},  # the ServerApp and ClientApp (need Flower)
}
FACE = float("inf")  # a folder's face, above its modules


def place(module: str) -> tuple[str | None, int | None, float | None]:
    """``(folder, floor, inner floor)`` of a module: its folder (None outside one), the package floor it is
    on (its folder's), and its floor inside the folder (None outside one; :data:`FACE` for the face);
    ``floor`` is None for a module placed nowhere."""
    name = module[len(ROOT) + 1:]
    for floor, names in FLOORS.items():
        if name in names:
            return None, floor, None
        if name + "/" in names:
            return name, floor, FACE
    folder, _, inner_name = name.rpartition(".")
    for floor, names in FLOORS.items():
        if folder and folder + "/" in names:
            inner = next((f for f, ns in FOLDERS.get(folder, {}).items() if inner_name in ns), None)
            return folder, (floor if inner is not None else None), inner
    return None, None, None


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
        if name not in MODULES or name == module or module.startswith(name + "."):
            continue  # not the package's, or the module itself or one of its own packages (`from . import x`)
        targets.add(name)
        parts = name.split(".")
        for i in range(2, len(parts)):  # parent packages, except the face and the importer's own packages
            parent = ".".join(parts[:i])
            if not (module == parent or module.startswith(parent + ".")):
                targets.add(parent)
    targets.discard(ROOT)
    return targets


GRAPH = {m: imported(m) for m in MODULES if m != ROOT}


PLACE = {m: place(m) for m in GRAPH}


def where(module: str) -> str:
    folder, floor, inner = PLACE[module]
    if folder is None:
        return f"floor {floor}"
    return f"floor {floor}, {folder}/ " + ("face" if inner == FACE else f"floor {inner}")


def test_every_module_is_placed_on_a_floor():
    unplaced = sorted(m for m, (_, floor, _) in PLACE.items() if floor is None)
    assert not unplaced, f"place these modules in FLOORS, or in FOLDERS if they are in a folder: {unplaced}"
    named = {f"{ROOT}.{n.rstrip('/')}" for names in FLOORS.values() for n in names}
    named |= {f"{ROOT}.{folder}.{n}" for folder, floors in FOLDERS.items() for names in floors.values() for n in names}
    assert not sorted(named - set(GRAPH)), "FLOORS or FOLDERS name modules that do not exist"
    folders = {n.rstrip("/") for names in FLOORS.values() for n in names if n.endswith("/")}
    assert folders == set(FOLDERS), "every folder in FLOORS has its floors in FOLDERS, and only those"


def upward(module: str) -> list[str]:
    """What ``module`` imports from above it: in its own folder, from a higher inner floor (the face is above
    every module); elsewhere, from a higher floor of the package (a folder's modules are on its floor)."""
    folder, floor, inner = PLACE[module]
    found = []
    for t in GRAPH[module]:
        t_folder, t_floor, t_inner = PLACE.get(t, (None, 0, None))
        if folder is not None and t_folder == folder:
            if t_inner > inner:
                found.append(t)
        elif (t_floor or 0) > (floor or 0):
            found.append(t)
    return sorted(found)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_module_imports_only_its_floor_or_below(module):
    found = upward(module)
    assert not found, f"{module} ({where(module)}) imports from higher floors: " + \
        ", ".join(f"{t} ({where(t)})" for t in found)


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
    assert "feddr_kit.sweep.workers" in GRAPH["feddr_kit.sweep.running"]  # from . import workers
    assert "feddr_kit.sweep" not in GRAPH["feddr_kit.sweep.running"]  # its own package: imported before it
    assert {"feddr_kit.rundir", "feddr_kit.federated"} <= GRAPH["feddr_kit.sweep.running"]  # from .. import, from ..x import
    assert "feddr_kit.flower.apps" in GRAPH["feddr_kit.flower"]  # inside the face's __getattr__


def test_the_floors_are_read():
    """Where modules are placed, inside a folder and out (a guard against a placement that finds nothing)."""
    assert PLACE["feddr_kit.errors"] == (None, 1, None)
    assert PLACE["feddr_kit.sweep"] == ("sweep", 10, FACE)
    assert PLACE["feddr_kit.sweep.grid"] == ("sweep", 10, 1) and PLACE["feddr_kit.sweep.cli"] == ("sweep", 10, 6)
    assert PLACE["feddr_kit.methods.base"] == ("methods", 4, 1)
    assert PLACE["feddr_kit.flower.apps"] == ("flower", 10, 2)


def test_an_upward_import_is_seen(monkeypatch):
    """The rule fails a planted import from above: inside a folder, out of one, and into one."""
    planted = {"feddr_kit.sweep.grid": {"feddr_kit.sweep.cli"},  # up inside the folder
               "feddr_kit.sweep.root": {"feddr_kit.sweep"},  # its face, from inside the folder
               "feddr_kit.flower.launch": {"feddr_kit.show"},  # out of a folder, to a higher floor
               "feddr_kit.rundir": {"feddr_kit.sweep.workers", "feddr_kit.sweep"}}  # into a folder on a higher floor
    for module, targets in planted.items():
        monkeypatch.setitem(GRAPH, module, GRAPH[module] | targets)
        assert upward(module) == sorted(targets), module
