"""Helpers shared by test modules (not collected: no test_*.py here); fixtures live in conftests."""
