"""Exceptions shared by the library and the CLI.

`UsageError` means the user asked for something invalid (bad flag, bad config field, missing file);
the CLI turns it into a one-line message and exit code 2. Anything else is a bug or an
infrastructure failure and keeps its traceback.
"""


class UsageError(Exception):
    """Invalid input from the user; the CLI exits with code 2 and prints the message."""


class SystemRequirementError(Exception):
    """A system component rlkit needs (bubblewrap, ...) is missing or broken; the message says
    how to install it. The CLI prints it on one line and exits with code 1."""


class RunStopped(RuntimeError):
    """A run stopped for a reason it can explain in one line (no learning signal, the trainer
    refusing its input, ...); its latest checkpoint stays where `--resume` continues. The CLI
    prints the message and exits with code 1."""


class InferenceError(RuntimeError):
    """A request to an inference server failed for good (after retries, or a non-retryable
    status); `status` is the HTTP status, None when the server did not answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
