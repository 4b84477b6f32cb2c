"""Reference decode (to be written)."""
