"""The kit's exception types: ``FeddrKitError`` for bad input, ``DivergedError`` for a run that diverged."""


class FeddrKitError(ValueError):
    """Bad input to a feddr_kit function.

    The message is one line: it names the offending argument and says what is allowed.
    """


class DivergedError(FeddrKitError, FloatingPointError):
    """Local training produced a non-finite loss (the learning rate is too large, usually).

    Also a ``FloatingPointError``, so ``except FloatingPointError`` keeps catching it. The message
    is one line: round, client, lr, and what to do.
    """
