"""Exceptions shared by the library and the CLI.

`UsageError` means the user asked for something invalid (bad flag, bad config field, missing file);
the CLI turns it into a one-line message and exit code 2. Anything else is a bug or an
infrastructure failure and keeps its traceback.
"""


class UsageError(Exception):
    """Invalid input from the user; the CLI exits with code 2 and prints the message."""
