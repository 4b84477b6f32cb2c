"""Mutants of dispatch's capture state (mla_core/dispatch.py: ``capturing``, the two memories) and of the cuda
backend's eager rule, judged on the CPU by tests/test_dispatch_capture.py (fakes, the capture state monkeypatched)."""
from __future__ import annotations

TESTS = "tests/test_dispatch_capture.py"
DISPATCH = "mla_core/dispatch.py"
CUDA = "backends/cuda/mla_core_cuda/backend.py"

MUTANTS = [
    dict(file=DISPATCH, old="    if capturing(problem):  # asked only",
         new="    if False:  # asked only", tests=[TESTS],
         why="one memory for both states: a capture's choice is replayed by the eager calls after it"),
    dict(file=DISPATCH, old="if eager is not None and key not in _captured:",
         new="if eager is not None and key not in _captured and not capturing(problem):",
         tests=[TESTS],
         why="a capture of a problem called eagerly decides again: a Triton kernel first launched in the capture"),
    dict(file=DISPATCH, old="if eager is not None and key not in _captured:",
         new="if eager is not None and key not in _captured and False:", tests=[TESTS],
         why="every call asks the stream's capture state (~0.3 us a call on the dispatch path)"),
    dict(file=DISPATCH, old="choice = _captured[key] = _decide(", new="choice = _memory[key] = _decide(",
         tests=[TESTS], why="a capture's decision stored as the eager one"),
    dict(file=DISPATCH, old="    _memory.clear()\n    _captured.clear()", new="    _memory.clear()",
         tests=[TESTS + " -k clear_memory"], why="captured choices outlive a plugin or cache change"),
    dict(file=DISPATCH, old='return problem.device == "cuda" and torch.cuda.is_initialized() and',
         new="return torch.cuda.is_initialized() and", tests=[TESTS],
         why="a CPU call counted as captured while a CUDA stream captures"),
    dict(file=DISPATCH, old="and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()",
         new="and torch.cuda.is_current_stream_capturing()", tests=[TESTS],
         why="the stream asked before CUDA started (raises on a CPU-only torch)"),
    dict(file=CUDA, old="problem.get(\"batch\", 1) >= 8 or not mla_core.dispatch.capturing(problem))",
         new="problem.get(\"batch\", 1) >= 8)", tests=[TESTS + " -k cuda_priority_for"],
         why="the eager 16-head decode step stays on triton's two launches (~94 us of host time a layer)"),
    dict(file=CUDA, old="problem.get(\"batch\", 1) >= 8 or not mla_core.dispatch.capturing(problem))",
         new="problem.get(\"batch\", 1) >= 8 or True)", tests=[TESTS + " -k cuda_priority_for"],
         why="captured 16-head decodes below batch 8 leave triton (2.4-4.7 us slower in a graph at L <= 4k)"),
    dict(file=CUDA, old='if problem["heads"] > 16 or (problem.get("num_kv_splits") == "auto" and (',
         new='if problem["heads"] > 16 or (True and (', tests=[TESTS + " -k cuda_priority_for"],
         why="eager decodes at the API's 32 splits leave triton, measured faster there"),
]
