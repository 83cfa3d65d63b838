"""Test suite; a package so shared test doubles import as `tests.fakes`."""
