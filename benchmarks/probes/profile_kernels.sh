#!/usr/bin/env bash
# Nsight Compute profile of the library's own kernels, one ncu run per named case (CASES, space-separated):
#   prefill:<recipe>             cuda prefill_kernel, causal 4 x 4096, 128 heads (recipe bf16 / fp8 / nvfp4)
#   decode:<heads>:<batch>:<len> cuda decode_wgmma_kernel, bf16 cache, page 64, auto splits
#   sparse:<layout>:<heads>:<batch>  cuda sparse_decode_kernel, top-k 2048 of 32k tokens, q_len 1 (layout fp8 /
#                                fp8_ds_mla; bench_sparse.py's case)
# Default CASES="prefill:bf16 prefill:nvfp4" (round p's question, benchmarks/NOTES.md "Prefill nvfp4 at 4 x 4096:
# what binds it, round (p)": with two consumer warpgroups in ping-pong, is the nvfp4 kernel bound by the tensor pipe
# waiting for the P step, or by the issue slots?). The same figures for decode / sparse at 128 heads answer the
# same question for issues 9 / 10.
# One device call from the repository root (clocks left alone: --clock-control none; ~20-30 s a case):
#   OUT=$OUT CASES="decode:128:32:8192 sparse:fp8:128:128" bash benchmarks/probes/profile_kernels.sh
# Per case one ncu run of the 3rd launch of the case's kernel (two warm-up calls before it), --kill once profiled;
# the reports and their raw pages go to $OUT/profile_kernels.tar.gz; the summary is printed and in $OUT/summary.txt.
# SOURCE=1 adds the SourceCounters section (warp-state sampling per SASS instruction) and, per case, its source page
# (ncu_<case>_sass.csv) and a ledger of the instructions where the warps wait most, with their opcodes' totals
# (the round q question: which barrier the 128-head decode's ~2 cycles of "barrier" stall per instruction sit on),
# each instruction named by its csrc/ line and inlining chain (sass_lines.py: the built extension's cubin through
# cuobjdump and nvdisasm -gi; used only when its opcodes are the report's one for one).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d)}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
W=$(mktemp -d)
export MLA_CORE_CHECKS=metadata PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$W/install.log" 2>&1 || . benchmarks/checkout_first.sh
timeout 120 python3 -c "from mla_core_cuda import build; print(build.build().__file__)" >"$W/build.log" 2>&1 || { tail -5 "$W/build.log"; echo "BUILD FAILED"; }
so=$(grep -E "\.so$" "$W/build.log" | tail -1)  # the extension the profiled calls load (SOURCE=1: its SASS lines)
cat >"$W/drive.py" <<'PY'
"""Three calls of one named case (profile_kernels.sh's header) on the cuda backend."""
import os, sys
import torch
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import mla_core  # noqa: E402
kind, *arg = sys.argv[1].split(":")
if kind == "prefill":
    from bench_prefill import CASES, make_inputs, recipe_kwargs
    inputs = make_inputs(CASES["4x4096"])
    run = lambda: mla_core.mla_prefill(*inputs, causal=True, backend="cuda", **recipe_kwargs(arg[0]))  # noqa: E731
elif kind == "decode":
    from bench_decode import make_inputs
    heads, batch, length = (int(x) for x in arg)
    q, cache, table, lens = make_inputs(batch, heads, length)
    run = lambda: mla_core.mla_attention_decode(q, cache, table, lens, softmax_scale=576 ** -0.5,  # noqa: E731
                                                num_kv_splits="auto", backend="cuda")
elif kind == "sparse":
    from bench_sparse import TOP_K, make_case
    layout, heads, batch = arg[0], int(arg[1]), int(arg[2])
    query, cache, indices, seq_lens = make_case(layout, batch, 1, heads)
    run = lambda: mla_core.sparse_mla_fp8_decode(query, cache, None, 128, 512, 64, indices, seq_lens, 0,  # noqa: E731
                                                 TOP_K, bmm1_scale=576 ** -0.5, backend="cuda")
else:
    sys.exit(f"unknown case {sys.argv[1]}")
for _ in range(3):
    run()
torch.cuda.synchronize()
PY
METRICS="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum"
METRICS+=",smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__cycles_active.avg"
METRICS+=",sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"
METRICS+=",smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_xu.sum"
METRICS+=",smsp__inst_executed_pipe_lsu.sum,gpu__time_duration.sum"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats"
[ "${SOURCE:-0}" = 1 ] && SECTIONS+=" --section SourceCounters --import-source no"
CASES=${CASES:-prefill:bf16 prefill:nvfp4}
for c in $CASES; do
  case $c in
    prefill:*) kernel="prefill_kernel|prefill_fp8_kernel" ;;  # the fp8 recipe runs on FP8 wgmma
    decode:*) kernel="decode_wgmma_kernel|decode_wgmma_ring4_kernel" ;;  # ring4: where the tuned cache picks it
    sparse:*) kernel=sparse_decode_kernel ;;
    *) echo "unknown case $c"; continue ;;
  esac
  tag=${c//:/_}
  rep="$W/ncu_$tag"
  timeout "${NCU_S:-90}" "$NCU" --clock-control none --kernel-name "regex:$kernel" --launch-skip 2 \
    --launch-count 1 --kill yes $SECTIONS --metrics "$METRICS" -o "$rep" -f python3 "$W/drive.py" "$c" \
    >"$W/ncu_${tag}_run.txt" 2>&1
  echo "ncu $c rc=$? ($(date +%T))"
  [ -f "$rep.ncu-rep" ] || { tail -6 "$W/ncu_${tag}_run.txt"; continue; }
  timeout 30 "$NCU" --import "$rep.ncu-rep" --page raw --csv >"$W/ncu_${tag}_raw.csv" 2>&1
  if [ "${SOURCE:-0}" = 1 ]; then
    timeout 60 "$NCU" --import "$rep.ncu-rep" --page source --csv --print-source sass >"$W/ncu_${tag}_sass.csv" 2>&1
    echo "  source page rc=$?"
    case $c in  # the kernel instance the case runs, for the ledger's source lines (in the built extension)
      decode:*) kregex="decode_wgmma_kernelI13__nv_bfloat16Li0ELi0E" ;;
      prefill:bf16) kregex="prefill_kernelILi0E" ;;
      prefill:nvfp4) kregex="prefill_kernelILi3E" ;;
      sparse:fp8:*) kregex="sparse_decode_kernelILb0E" ;;
      sparse:fp8_ds_mla:*) kregex="sparse_decode_kernelILb1E" ;;
      *) kregex="" ;;
    esac
    lines=""; [ -n "$kregex" ] && [ -n "$so" ] && lines="$so:$kregex"
    timeout 150 python3 benchmarks/probes/stall_ledger.py "$W/ncu_${tag}_sass.csv" ${lines:+--lines "$lines"} 2>&1 \
      | tee "$W/ledger_$tag.txt" | head -"${LEDGER_LINES:-70}"
  fi
done
timeout 30 python3 - "$W" ${CASES//:/_} <<'PY' 2>&1 | tee "$W/summary.txt"
import csv, sys
w, cases = sys.argv[1], sys.argv[2:]
def raw(r):
    try:
        rows = list(csv.reader(open(f"{w}/ncu_{r}_raw.csv")))
    except OSError:
        return {}
    head = next((i for i, row in enumerate(rows) if "ID" in row[:2] or "Kernel Name" in row), None)
    if head is None or head + 2 >= len(rows):
        return {}
    names, vals = rows[head], rows[head + 2]  # header, units, first kernel
    out = {}
    for n, v in zip(names, vals):
        try:
            out[n] = float(v.replace(",", ""))
        except ValueError:
            pass
    return out
data = {r: raw(r) for r in cases}
keys = [("gpu__time_duration.sum", "duration under ncu (ms)"),
        ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe active %"),
        ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue active % (per SMSP)"),
        ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "fma pipe active %"),
        ("sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active", "alu pipe active %"),
        ("smsp__inst_executed.sum", "instructions (warp)"),
        ("smsp__inst_executed_pipe_fma.sum", "  fma pipe"), ("smsp__inst_executed_pipe_alu.sum", "  alu pipe"),
        ("smsp__inst_executed_pipe_xu.sum", "  xu pipe"), ("smsp__inst_executed_pipe_lsu.sum", "  lsu pipe"),
        ("sm__inst_executed_pipe_tensor_op_hmma.sum", "  tensor (hmma)"), ("smsp__cycles_active.avg", "SMSP active cycles"),
        ("smsp__warps_active.avg.per_cycle_active", "warps active / SMSP"),
        ("smsp__warps_eligible.avg.per_cycle_active", "warps eligible / SMSP")]
print(f"{'metric':34s}" + "".join(f"{r:>22s}" for r in cases))
for k, label in keys:
    print(f"{label:34s}" + "".join(f"{data[r].get(k, float('nan')):22.4g}" for r in cases))
for r in cases:  # the largest warp stall reasons (per issued instruction, cycles)
    stalls = {k.split("issue_stalled_")[1].split("_per_issue_active")[0]: v for k, v in data[r].items()
              if k.startswith("smsp__average_warps_issue_stalled_") and k.endswith("_per_issue_active.ratio")}
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:7]
    print(f"{r} stalls (cycles per issued instruction): " + ", ".join(f"{n} {v:.2f}" for n, v in top))
PY
tar -czf "$OUT/profile_kernels.tar.gz" -C "$W" . && cp "$W/summary.txt" "$W"/ledger_*.txt "$OUT/" 2>/dev/null
