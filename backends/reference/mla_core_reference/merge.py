"""Reference merge (to be written)."""
