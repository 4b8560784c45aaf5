"""The suite's own scheduling: the longest files go first so that two xdist processes finish together."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

# Loaded from its file: in a whole-suite session "conftest" names notebooks/conftest.py as well.
_spec = importlib.util.spec_from_file_location("tests_conftest", Path(__file__).with_name("conftest.py"))
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
LONGEST_FIRST, REPO_ROOT = _conftest.LONGEST_FIRST, _conftest.REPO_ROOT
pytest_collection_modifyitems = _conftest.pytest_collection_modifyitems


def test_every_file_named_longest_first_exists():
    """A renamed or removed file would silently drop out of the order and could again run alone at the end."""
    missing = [path for path in LONGEST_FIRST if not (REPO_ROOT / path).is_file()]
    assert not missing, f"LONGEST_FIRST names files that are gone: {missing}"


def test_the_longest_files_come_first_and_each_file_keeps_its_order():
    named = [SimpleNamespace(nodeid=f"{LONGEST_FIRST[i]}::test_{j}") for i in (2, 0) for j in (1, 0)]
    other = [SimpleNamespace(nodeid=f"tests/test_a.py::test_{j}") for j in (1, 0)]
    items = [other[0], named[0], named[2], other[1], named[1], named[3]]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [f"{LONGEST_FIRST[0]}::test_1", f"{LONGEST_FIRST[0]}::test_0",
                                         f"{LONGEST_FIRST[2]}::test_1", f"{LONGEST_FIRST[2]}::test_0",
                                         "tests/test_a.py::test_1", "tests/test_a.py::test_0"]
