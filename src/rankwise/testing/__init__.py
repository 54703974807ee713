"""Test-only helpers shipped with rankwise so that launched workers can use them; nothing here runs
unless a test's environment asks for it."""
