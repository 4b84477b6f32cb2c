#!/usr/bin/env bash
# CPU only: compile benchmarks/probes/prefill_p_nvfp4_count.cu for sm_90a and count, per probe kernel, the SASS
# instructions on its main path (up to its EXIT; the __frcp_rn / __fdiv_rn slow-path subroutines after it are not
# counted) less its loads and stores: P's NVFP4 step per consumer thread per 64-key tile, round (m)'s (new 0) and
# this tree's (new 1), kP 3 (division-free) and 4 (IEEE). cuobjdump: $CUOBJDUMP, else on PATH, else Triton's.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d)
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cubin -Xptxas -v -o "$out/p.cubin" \
  benchmarks/probes/prefill_p_nvfp4_count.cu 2>&1 | grep -A2 "p_step_probe" | grep -E "spill|registers" || true
cuo=${CUOBJDUMP:-$(command -v cuobjdump || python3 -c "import triton, os; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/cuobjdump'))")}
"$cuo" -sass "$out/p.cubin" | python3 -c '
import re, sys
name, n, ldst, done, rows = None, 0, 0, True, []
for line in sys.stdin:
    m = re.search(r"Function : (\S+)", line)
    if m:
        if name: rows.append((name, n, ldst))
        name, n, ldst, done = m.group(1), 0, 0, False
        continue
    m = re.search(r"/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([^;]*);", line)
    if not m or done or name is None: continue
    n += 1
    ldst += bool(re.match(r"(LDG|STG)", m.group(2)))
    done = m.group(2).startswith("EXIT")
if name: rows.append((name, n, ldst))
for name, n, ldst in rows:
    k = re.search(r"p_step_probeILi(\d)ELi(\d)", name)
    if k: print(f"kP {k.group(1)} new {k.group(2)}: {n - ldst} instructions (main path {n}, loads/stores {ldst})")
'
