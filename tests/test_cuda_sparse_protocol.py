"""CPU checks of the cuda sparse decode's fp8_ds_mla synchronization against the kernel's text (no GPU).

A dropped barrier between producer warps is a race the GPU tests only see when warps drift far enough apart, so
the protocol is checked where it is deterministic: ``benchmarks/probes/sparse_wgmma_ds_emulation.py`` models the
kernel's programs (its constants, the bytes every thread converts, the barriers between them, op for op) and
reads ``csrc/mla_sparse_wgmma.cu`` to check the model is the kernel. The full interleaving exploration (~25 s)
stays in the probe; these are its fast text and byte checks (~3 s).
"""
from __future__ import annotations

import sys
from pathlib import Path

PROBES = Path(__file__).resolve().parents[1] / "benchmarks" / "probes"
sys.path.insert(0, str(PROBES))
import sparse_wgmma_ds_emulation as ds  # noqa: E402


def test_shared_memory_regions_are_disjoint_and_fit():
    errors, end = ds.check_regions()
    assert not errors and end <= ds.C["kSmemBytes"]


def test_the_producer_converts_every_byte_once_and_reads_before_overwriting():
    assert ds.check_producer_bytes() == []


def test_the_consumers_address_the_converted_tile():
    assert ds.check_consumer_bytes() == []


def test_the_kernel_text_is_the_checked_protocol():
    """The kDs tile loops and convert_in_place<true> (loads, PROD barriers, stores, in order) match the model."""
    assert ds.check_against_source() == []


def test_barrier_skeletons_match_the_checked_variants():
    assert [e for tiles in range(1, 5) for e in ds.check_skeleton(tiles)] == []


def test_a_dropped_conversion_barrier_is_caught_by_the_byte_check():
    """The check can fail: slab 7 stored without the last PROD barrier overwrites codes other threads still read."""
    assert ds.check_producer_bytes(prod3=False)
