#!/usr/bin/env bash
# One device call (issues 9 and 11): host microseconds per eager CUDA op on the device host, the eager decode step's host time
# with a cProfile (benchmarks/host_overhead.py), and a small warm-up whose exported entries name the slowest
# candidates per shape (the "s" seconds field): where the TP 8 warm-up's time goes. Logs in $OUT.
#   MLA_COMMIT=<hash> bash benchmarks/host_warmup_device.sh
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
bash benchmarks/device_run.sh build 2>&1 | tail -3
python3 - <<'PY'
import time, torch
x = torch.ones(16, device="cuda"); torch.cuda.synchronize()
for name, fn in [("add", lambda: x.add(1)), ("empty", lambda: torch.empty(16, device="cuda")), ("mm 1x7168x1536", None)]:
    if fn is None:
        a = torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16); w = torch.randn(1536, 7168, device="cuda", dtype=torch.bfloat16)
        fn = lambda: torch.nn.functional.linear(a, w)
    for _ in range(100): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(2000): fn()
    dt = (time.perf_counter() - t) / 2000; torch.cuda.synchronize()
    print(f"host us per eager {name}: {dt*1e6:.1f}")
PY
timeout 120 python3 benchmarks/host_overhead.py --device cuda --dims deepseek --heads 16 --length 8192 --backend '' --profile 25 2>&1 | tee $OUT/host_overhead.log | head -150
export MLA_CORE_CACHE_DIR=$(mktemp -d)
timeout 150 python3 -m mla_core.cli warmup --model deepseek-v3 --tp 8 --ops decode --batch 1 --lengths 1024,4096 --recipes bf16,fp8,nvfp4 --no-progress 2>&1 | tee $OUT/warmup_mini.log | tail -12
python3 -m mla_core.cli cache export $OUT/warmup_mini.json
python3 - "$OUT/warmup_mini.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
entries = d.get("entries", d)
for key, e in entries.items():
    cands = sorted(e.get("candidates", []), key=lambda c: -c.get("s", 0))[:3]
    print(key[:90], [(c["backend"], json.dumps(c.get("config"))[:60], c.get("s"), c.get("timing"), (c.get("error") or "")[:60]) for c in cands])
PY
