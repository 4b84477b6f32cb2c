"""Reference prefill (to be written)."""
