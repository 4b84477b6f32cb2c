"""Reference rope (to be written)."""
