"""The kit's exception types: ``FeddrKitError`` for bad input, ``DivergedError`` for a run that diverged,
``StorageError`` for a result file that could not be written; and how a command line reports one
(:func:`report`: one line on stderr, and the error's exit code)."""
from __future__ import annotations

import sys


class FeddrKitError(ValueError):
    """Bad input to a feddr_kit function.

    The message is one line: it names the offending argument and says what is allowed.
    """

    # The command line's exit code for this error (read by exit_code): 2, bad input. A subclass whose
    # failure is of another kind says so with its own.
    exit_code = 2


class DivergedError(FeddrKitError, FloatingPointError):
    """Local training produced a non-finite loss (the learning rate is too large, usually).

    Also a ``FloatingPointError``, so ``except FloatingPointError`` keeps catching it. The message
    is one line: round, client, lr, and what to do.
    """

    exit_code = 1  # the input was valid and the run failed


class StorageError(FeddrKitError, OSError):
    """A result file could not be written (a full disk, a quota, a lost mount).

    Also an ``OSError``. The message is one line: the file, the reason, and that the files written
    before (the last checkpoint) are intact, so the run resumes once there is room.
    """

    exit_code = 3  # nothing wrong with the input: the same command goes on once there is room


class BusyError(FeddrKitError):
    """A run folder is held by another live run (its ``.lock``). The message is one line naming the holder."""


def exit_code(err: BaseException) -> int:
    """The command line's exit code for one of the kit's errors: 1 a run failed (it diverged, or its process
    was lost), 2 bad input, 3 a result file could not be written. Each error class holds its own
    (``exit_code``), so a family's error needs no entry here. An exception that is not the kit's is raised
    again: it is a bug to see in full, never a code."""
    if not isinstance(err, FeddrKitError):
        raise err
    return err.exit_code


def report(err: BaseException) -> int:
    """Print ``error: <message>`` on stderr (the kit's messages are one line) and return the exit code
    (:func:`exit_code`); what a command does with every error it catches::

        try:
            ...
        except FeddrKitError as err:
            return report(err)
    """
    code = exit_code(err)
    print(f"error: {err}", file=sys.stderr)
    return code
