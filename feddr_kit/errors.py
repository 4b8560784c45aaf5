"""The kit's exception types: ``FeddrKitError`` for bad input, ``DivergedError`` for a run that diverged,
``StorageError`` for a result file that could not be written."""


class FeddrKitError(ValueError):
    """Bad input to a feddr_kit function.

    The message is one line: it names the offending argument and says what is allowed.
    """


class DivergedError(FeddrKitError, FloatingPointError):
    """Local training produced a non-finite loss (the learning rate is too large, usually).

    Also a ``FloatingPointError``, so ``except FloatingPointError`` keeps catching it. The message
    is one line: round, client, lr, and what to do.
    """


class StorageError(FeddrKitError, OSError):
    """A result file could not be written (a full disk, a quota, a lost mount).

    Also an ``OSError``. The message is one line: the file, the reason, and that the files written
    before (the last checkpoint) are intact, so the run resumes once there is room.
    """


class BusyError(FeddrKitError):
    """A run folder is held by another live run (its ``.lock``). The message is one line naming the holder."""
