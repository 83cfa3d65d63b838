"""Test suite; a package so shared helpers import as `tests.helpers.*`."""
