"""Benchmarks: commands that print a table and write JSON (``keel bench core|codec``)."""
