"""Mutants of the cuda decode launcher's host side (backends/cuda/mla_core_cuda/decode.py's launch plans, the
backend's loaded extension), judged on the CPU by tests/test_cuda_decode_plan.py (the extension a recorder)."""
from __future__ import annotations

PLAN_TESTS = "tests/test_cuda_decode_plan.py"
DECODE = "backends/cuda/mla_core_cuda/decode.py"

MUTANTS = [
    dict(file=DECODE, old="call.page_size, call.num_kv_splits, call.softmax_scale,",
         new="call.page_size, call.num_kv_splits,", tests=[PLAN_TESTS],
         why="the softmax scale left out of the plan's key: a new scale launches with the old score factor"),
    dict(file=DECODE, old="call.k_qdq, call.k_amax, call.v_qdq, call.v_amax, call.p_qdq",
         new="call.k_qdq, call.k_amax, call.v_qdq, call.p_qdq", tests=[PLAN_TESTS],
         why="V's amax left out of the key: V's factor, the shared-codes flag and the kernel stay the old call's"),
    dict(file=DECODE, old="key = (q.shape, device, call.block_table.shape[1], call.page_size,",
         new="key = (q.shape, device, call.page_size,", tests=[PLAN_TESTS],
         why="the table width left out of the key: an auto split count capped by the tiles stays the old one"),
    dict(file=DECODE, old="call.p_qdq, call.p_amax,\n           tuple(config.items()))",
         new="call.p_qdq, call.p_amax)", tests=[PLAN_TESTS],
         why="the config left out of the key: another kernel, CTA shape or split count runs the cached plan"),
    dict(file=DECODE, old="call.softmax_scale,\n           call.kv_scale, call.k_qdq,",
         new="call.softmax_scale,\n           call.k_qdq,", tests=[PLAN_TESTS],
         why="the FP8 cache's scale left out of the key: a new kv_scale launches with the old factors"),
    dict(file=DECODE, old="    kv = 1.0 if call.kv_scale is None else call.kv_scale",
         new="    kv = 1.0", tests=[PLAN_TESTS],
         why="the FP8 cache's scale never applied: scores and outputs of the codes, not the values"),
    dict(file="backends/cuda/mla_core_cuda/backend.py", old="        self._loaded = module\n", new="",
         tests=[PLAN_TESTS + " -k asked_for_once"],
         why="the loaded extension not kept: every decode asks the build again (host time per eager step)"),
    # run.py ids cuda_launcher#8-10: the fused layer's decode with its prep inside the extension call (round m)
    dict(file=DECODE, old="(0, head_tiles, warps)", new="(0, warps, head_tiles)",
         tests=["tests/test_cuda_decode_plan.py -k layer_decode_runs_the_configs_kernel"],
         why="the mma.sync CTA shape handed to layer_decode as (warps, head_tiles)"),
    dict(file=DECODE, old='args + (True,), (2, 0, 0)', new='args + (True,), (1, 0, 0)',
         tests=["tests/test_cuda_decode_plan.py -k layer_decode_runs_the_configs_kernel"],
         why="a keys-as-M plan runs the 64-head WGMMA kernel inside layer_decode"),
    dict(file="backends/cuda/mla_core_cuda/backend.py",
         old="        return decode.run(self._module(), call, config, prep)",
         new="        return decode.run(self._module(), call, config)",
         tests=["-m gpu tests/test_layer_cuda_prep.py -k 'bit_equal and 16-64'"], gpu=True,
         why="the prep's tensors dropped: the decode runs on the poisoned absorbed query and key counts"),
]
