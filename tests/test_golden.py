"""Every algorithm, personalization and chapter computation gives exactly its recorded numbers.

The cases and how to regenerate ``tests/golden_history.json`` are in ``tests/golden.py``: regenerate
only for a change that is meant to change the numbers. A refactor must leave every record as it is.
"""
import pytest

import golden

pytestmark = pytest.mark.usefixtures("one_thread")
STORED = golden.load()


def test_every_case_is_recorded():
    assert list(STORED) == list(golden.CASES)


@pytest.mark.parametrize("name", list(golden.CASES))
def test_case_equals_its_record(name):
    difference = golden.first_difference(golden.compute(name), STORED[name], name)
    assert difference is None, difference
