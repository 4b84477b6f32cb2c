#!/usr/bin/env bash
# Nsight Compute profile of the cuda backend's WGMMA kernels at the shapes where they trail FlashMLA, on a
# Firecracker H200 (ncu reads the hardware counters there; --clock-control none leaves the clocks alone):
#   MLA_COMMIT=<hash> bash benchmarks/probes/profile_wgmma_kernels.sh     (writes $OUT/ncu_*.txt)
#   RECIPE=fp8 MLA_COMMIT=<hash> bash benchmarks/probes/profile_wgmma_kernels.sh   (the fp8 recipe instead, below)
# One launch of the decode split kernel after warm-up at 128 heads, batch 32 / 128, length 8192 (auto splits:
# 2 / 1), called through the extension directly (no dispatch, no combine in the profile). Sections: speed of
# light, compute (tensor pipe), memory (shared-memory wavefronts, L2, DRAM), warp states (stall reasons),
# scheduler; plus the tensor-pipe and shared-memory counters the notes argue about (benchmarks/NOTES.md, "The
# seesaw kernel in the library": S on m64n32k16 re-reads Q; is the tensor pipe or shared memory the limit?).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d)}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
python3 -c "from mla_core_cuda import build; build.build()" 2>&1 | tail -1
METRICS=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__cycles_active.avg,dram__bytes_read.sum,lts__t_bytes.sum
SECTIONS="--section SourceCounters --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats"

cat >/tmp/mla_profile_decode.py <<'EOF'
import math, sys, torch
from mla_core_cuda import build
module = build.build()
heads, batch, length, splits = (int(x) for x in sys.argv[1:5])
g = torch.Generator(device="cuda").manual_seed(0)
pages = batch * length // 64
cache = (torch.rand(pages, 64, 576, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
q = (torch.rand(batch, heads, 576, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(batch, length // 64)
lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
out = torch.empty(batch, heads, 512, dtype=torch.bfloat16, device="cuda")
lse = torch.empty(batch, heads, dtype=torch.float32, device="cuda")
part_o = torch.empty(batch * heads * splits * 512, device="cuda") if splits > 1 else None
part_lse = torch.empty(batch * heads * splits, device="cuda") if splits > 1 else None
for _ in range(4):
    # unquantized: out_scale, k / v / p scales 1, formats 0 (none), V not from K's codes, no exact division
    module.decode_wgmma(q, cache, table, lens, out, lse, part_o, part_lse, splits, 576 ** -0.5 * math.log2(math.e),
                        1.0, 1.0, 1.0, 1.0, 0, 0, 0, False, False)
torch.cuda.synchronize()
EOF

if [ "${RECIPE:-bf16}" = fp8 ]; then
  # The fp8 recipe (K = V FP8 per-tensor, P FP8) through the public op, at 16 and 64 heads, batch 128, 8k keys (one
  # split): which pipe the producer's in-place K conversion fills (benchmarks/NOTES.md, "K = V FP8 converted by the
  # consumers", result: the conversion is throughput-bound at ~3 us a step wherever it runs). InstructionStats gives
  # the SASS opcode mix, ComputeWorkloadAnalysis the per-pipe utilization, PIPES the candidate pipes' counters.
  cat >/tmp/mla_profile_fp8.py <<'PY'
import sys, torch, mla_core
heads, batch, length = (int(x) for x in sys.argv[1:4])
g = torch.Generator(device="cuda").manual_seed(0)
pages = batch * length // 64
cache = (torch.rand(pages, 64, 576, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
q = (torch.rand(batch, heads, 576, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(batch, length // 64)
lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
for _ in range(4):
    mla_core.mla_attention_decode(q, cache, table, lens, softmax_scale=576 ** -0.5, kv_lora_rank=512,
                                  qk_rope_head_dim=64, num_kv_splits=1, k_qdq="fp8", k_qdq_amax=1.0, v_qdq="fp8",
                                  v_qdq_amax=1.0, p_qdq="fp8", backend="cuda")
torch.cuda.synchronize()
PY
  PIPES=sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_fp16.sum,sm__inst_executed_pipe_xu.sum,sm__inst_executed_pipe_lsu.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fp16_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_xu_cycles_active.avg.pct_of_peak_sustained_active
  for shape in "16 128 8192" "64 128 8192"; do
    tag=$(echo "$shape" | tr ' ' '_')
    echo "=== fp8 recipe, decode_wgmma_kernel H B L = $shape"
    timeout 240 "$NCU" --clock-control none --kernel-name regex:decode_wgmma_kernel --launch-skip 3 --launch-count 1 \
      $SECTIONS --section InstructionStats --metrics "$METRICS,$PIPES" python3 /tmp/mla_profile_fp8.py $shape \
      >"$OUT/ncu_fp8_$tag.txt" 2>&1
    echo "rc=$?"; grep -E "Duration|Issued Ipc|pipe_|F2FP|Stall" "$OUT/ncu_fp8_$tag.txt" | head -40
  done
  exit 0
fi

for shape in "128 32 8192 2" "128 128 8192 1"; do
  tag=$(echo "$shape" | tr ' ' '_')
  echo "=== decode_wgmma_kernel H B L splits = $shape"
  timeout 240 "$NCU" --clock-control none --kernel-name regex:decode_wgmma_kernel --launch-skip 3 --launch-count 1 \
    $SECTIONS --metrics "$METRICS" python3 /tmp/mla_profile_decode.py $shape >"$OUT/ncu_decode_$tag.txt" 2>&1
  echo "rc=$?"; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|hmma|wavefronts|bank_conflicts|Stall|Issued Ipc" \
    "$OUT/ncu_decode_$tag.txt" | head -30
done
