"""The one rule from the kit's errors to a command's exit code (:func:`feddr_kit.errors.report`), which every
command line uses: 1 a run failed, 2 bad input, 3 a result file could not be written."""
import pytest

from feddr_kit import errors
from feddr_kit.errors import BusyError, DivergedError, FeddrKitError, StorageError
from feddr_kit.sweep.workers import WorkerLostError


@pytest.mark.parametrize("error,code", [
    (FeddrKitError("rounds: must be at least 1, got 0"), 2),
    (BusyError("runs/x is held by pid 12"), 2),
    (DivergedError("round 3, client 7: the local loss became nan at lr=10"), 1),
    (WorkerLostError("the process of run a=1 was killed (SIGKILL)"), 1),
    (StorageError("cannot write runs/x/history.csv: no space left on device"), 3),
])
def test_each_error_gives_its_code_and_one_line(error, code, capsys):
    assert errors.exit_code(error) == code
    assert errors.report(error) == code
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {error}\n"


def test_an_unexpected_exception_is_not_swallowed(capsys):
    bug = KeyError("not the kit's")
    for helper in (errors.exit_code, errors.report):
        with pytest.raises(KeyError) as raised:
            helper(bug)
        assert raised.value is bug
    assert capsys.readouterr().err == ""  # no "error:" line for it: its traceback is what tells
