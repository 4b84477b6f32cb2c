"""Reference sparse (to be written)."""
