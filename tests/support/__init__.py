"""Support code shared by the tests (not a test module)."""
