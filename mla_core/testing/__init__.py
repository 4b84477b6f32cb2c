"""Test helpers for mla_core and its backend plugins: boundary shapes (:mod:`mla_core.testing.shapes`)."""
