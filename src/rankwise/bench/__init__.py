"""Benchmarks: they print numbers; nothing here is a test."""
