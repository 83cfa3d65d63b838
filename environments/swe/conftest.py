"""The shipped repositories carry their own test suites: they run in the sandbox, not here."""

collect_ignore = ["swe_env/repos"]
