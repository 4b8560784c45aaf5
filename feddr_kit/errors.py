"""The kit's one exception type for bad input."""


class FeddrKitError(ValueError):
    """Bad input to a feddr_kit function.

    The message is one line: it names the offending argument and says what is allowed.
    """
