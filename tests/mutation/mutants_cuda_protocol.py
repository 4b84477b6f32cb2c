"""Mutants of the cuda sparse decode's fp8_ds_mla synchronization that the GPU tests cannot kill deterministically:
a dropped barrier between producer warps is a race that shows only when warps drift apart (the last PROD barrier's
mutant survived the GPU selection on the H200 at f2e3666). tests/test_cuda_sparse_protocol.py checks the kernel's
text against the probe's byte and protocol model on the CPU, so these are judged by ``tests/mutation/run.py``.
"""
from __future__ import annotations

PROTOCOL_TESTS = "tests/test_cuda_sparse_protocol.py"

MUTANTS = [
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="    nb_sync<kProducerThreads>(kBarProd);  // blocks 6-7 read by every producer thread: slab 7 may overwrite "
             "them\n",
         new="",
         tests=[PROTOCOL_TESTS],
         why="fp8_ds_mla conversion's last PROD barrier dropped: slab 7 stored over blocks 6-7 another thread may "
             "not have read"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="    nb_sync<kProducerThreads>(kBarProd);  // blocks 0-5 read by every producer thread: slabs 4-6 may "
             "overwrite them\n",
         new="",
         tests=[PROTOCOL_TESTS],
         why="fp8_ds_mla conversion's second PROD barrier dropped: slabs 4-5 stored over blocks 0-3 other threads "
             "may not have read"),
]
