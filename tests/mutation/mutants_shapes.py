"""Mutants of the boundary-shape generators (mla_core/testing/shapes.py): each makes a generator miss an edge
it promises. tests/test_shapes.py must notice; a miss here would silently weaken every backend's tests.
"""

SHAPES = "mla_core/testing/shapes.py"
TESTS = ["tests/test_shapes.py"]

MUTANTS = [
    dict(file=SHAPES, old="            out.update((k * tile - 1, k * tile, k * tile + 1))",
         new="            out.update((k * tile - 1, k * tile))", tests=TESTS,
         why="boundary_lengths must include k*T + 1 (one past the tile edge)"),
    dict(file=SHAPES, old="    out = {0, 1, *extra}", new="    out = {1, *extra}", tests=TESTS,
         why="boundary_lengths must include 0 (an empty request)"),
    dict(file=SHAPES, old="        first_shift = (-last_row) % block_n or block_n",
         new="        first_shift = (-last_row - 1) % block_n or block_n", tests=TESTS,
         why="causal pairs must put the tile's last visible key on the key-tile edge, not one before it"),
    dict(file=SHAPES, old="        last_row = j * block_m + block_m - 1  # the tile's last query row",
         new="        last_row = j * block_m + block_m  # the tile's last query row", tests=TESTS,
         why="the last row of a query tile is m0 + block_m - 1"),
    dict(file=SHAPES, old="    tile_counts = {k * num_splits for k in multiples} | {num_splits - 1, num_splits + 1}",
         new="    tile_counts = {k * num_splits for k in multiples} | {num_splits + 1}", tests=TESTS,
         why="split lengths must include a tile count one short of the split count (an empty split)"),
]
