"""Mutants of the tuner's memory hygiene across shapes (tests/test_autotune_memory.py): a shape's tensors kept into the
next one, its cached device memory (dead CUDA graphs' pools included) never given back."""

_TUNER = "mla_core/autotune/tuner.py"
_WARMUP = "mla_core/autotune/warmup.py"
_TESTS = "tests/test_autotune_memory.py"

MUTANTS = [
    dict(file=_TUNER,
         old="    _keep_shared_reference_only_for(problem)\n    try:",
         new="    try:",
         tests=[f"{_TESTS} -k lives_on"],
         why="the kept prefill reference (sampled inputs and result) lives on through the timing of every later "
             "shape until the warm-up ends"),
    dict(file=_TUNER,
         old="    if _shared_reference is not None and _shared_reference.owner != _key_without_lse(problem):",
         new="    if _shared_reference is not None and _shared_reference.key != _key_without_lse(problem):",
         tests=["tests/test_autotune_check.py -k lse_runs_the_reference_once"],
         why="the kept reference is dropped before its LSE twin too: the prefill pair runs the reference twice"),
    dict(file=_TUNER,
         old="    finally:\n        release_memory(torch.device(device if device is not None else problem.device)"
             ".type)",
         new="    finally:\n        pass",
         tests=[f"{_TESTS} -k failed_ones_too"],
         why="a tune leaves its cached memory (and its graphs' dead pools) on the device for the next shape"),
    dict(file=_WARMUP,
         old="            tuner.release_memory(problem.device, collect=True)",
         new="            tuner.release_memory(problem.device)",
         tests=[f"{_TESTS} -k failed_ones_too"],
         why="a shape that raised keeps what its traceback's reference cycles hold until the collector happens by"),
    dict(file=_TUNER,
         old="            if device.type == \"cuda\":\n                _room_for_capture(device)",
         new="            if False:\n                _room_for_capture(device)",
         tests=[f"-m gpu {_TESTS} -k dead_graphs_pools"], gpu=True,
         why="captures run with dead graphs' pools still reserved (the TP 1 warm-up's out-of-memory)"),
    dict(file=_TUNER,
         old="    if device_type == \"cuda\" and torch.cuda.is_initialized():",
         new="    if False:",
         tests=[f"-m gpu {_TESTS} -k back_to_back"], gpu=True,
         why="a warm-up's shapes leave their cached blocks and dead graph pools reserved for the next shapes"),
]
