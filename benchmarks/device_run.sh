#!/usr/bin/env bash
# One call on the lent GPU machine: install mla_core, then run the named steps; logs and tables go to $OUT.
#   bash benchmarks/device_run.sh tests decode prefill dispatch warmup
# Steps: tests (pytest -m gpu), gputests (the same on GPU_WORKERS xdist workers, log in $OUT), build (mla-core build),
# probes (every benchmarks/probes/run_*_probe.sh of the decode / sparse / prefill probes and the ncu profile, logs in $OUT),
# bench_cli (mla-core bench decode 128 heads and its plot), cuda (build + GPU tests + memcheck + mutants of the CUDA C++ backend), decode / prefill
# (benchmarks), dispatch (overhead), warmup (DeepSeek-V3 at each TP in
# WARMUP_TP, default 8, logs and $OUT/NVIDIA_H200.json for autotune_cache/; WARMUP_FRESH=1 empty Triton cache; WARMUP_ARGS; WARMUP_TIMEOUT s per TP), check (mla-core check on cuda),
# sync2 (on a 2-GPU machine: warm-up under torchrun, then every rank must dispatch alike), tp2 (2 GPUs: bench_tp.py).
# sparse / rope (musa_fp8 benchmarks), layer (benchmarks/bench_layer.py, log in $OUT). Extra arguments for a benchmark go in DECODE_ARGS / PREFILL_ARGS / SPARSE_ARGS / ROPE_ARGS / LAYER_ARGS.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
LOGS=$(mktemp -d)
cd "$(dirname "$0")/.."

if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$LOGS/install.log" 2>&1 \
   || ! python3 -c "import mla_core, sys; sys.exit(0 if {'reference', 'triton'} <= set(mla_core.backends()) else 1)"; then
  # Fallback seen needed once: put the sources on the path and declare the entry points by hand.
  echo "editable install did not register the plugins; using PYTHONPATH + a hand-written dist-info" | tee -a "$LOGS/install.log"
  . benchmarks/checkout_first.sh
  CLI=(python3 -m mla_core.cli)
else
  CLI=(mla-core)
fi
mla_core_cli() { "${CLI[@]}" "$@"; }
python3 -c "import mla_core, torch, triton; print('mla_core', mla_core.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'backends', sorted(mla_core.backends()))"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
echo "commit ${MLA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)} (the working tree copied to the device)"

for step in "$@"; do
  echo "=== $step ($(date +%T))"
  case $step in
    tests)    python3 -m pytest -m gpu -q -p no:cacheprovider -x --durations=10 2>&1 | tee "$LOGS/gpu_tests.log" | tail -25 ;;
    build)    { time mla_core_cli build; } 2>&1 | tee "$LOGS/build.log" | tail -6 ;;
    gputests) # every GPU test, spread over GPU_WORKERS pytest-xdist workers (Triton compiles are CPU-bound); log to $OUT
      # SIGINT at the limit: pytest then still prints the short summary of the failures it saw
      timeout -s INT -k 20 "${GPU_TESTS_TIMEOUT:-420}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=15 \
        -n "${GPU_WORKERS:-8}" ${GPU_TESTS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
    bench_cli) # the CLI's own benchmark and roofline picture (issue 8)
      mla_core_cli bench decode --heads 128 --batch 32 --length 8192 --recipe bf16,fp8,nvfp4 \
        --plot "$OUT/bench_decode_cli.png" --output "$OUT/bench_decode_cli.json" 2>&1 | tee "$OUT/bench_decode_cli.log" | tail -20 ;;
    decode)   OUT=$LOGS python3 benchmarks/bench_decode.py ${DECODE_ARGS:-} 2>&1 | tee "$LOGS/bench_decode.log" ;;
    prefill)  OUT=$LOGS python3 benchmarks/bench_prefill.py ${PREFILL_ARGS:-} 2>&1 | tee "$LOGS/bench_prefill.log" ;;
    sparse)   OUT=$LOGS python3 benchmarks/bench_sparse.py ${SPARSE_ARGS:-} 2>&1 | tee "$LOGS/bench_sparse.log" ;;
    rope)     OUT=$LOGS python3 benchmarks/bench_rope.py ${ROPE_ARGS:-} 2>&1 | tee "$LOGS/bench_rope.log" ;;
    layer)    timeout "${LAYER_TIMEOUT:-240}" python3 benchmarks/bench_layer.py ${LAYER_ARGS:-} 2>&1 | tee "$OUT/bench_layer.log" | tail -60
              cp "$LOGS"/bench_layer.json "$OUT"/ 2>/dev/null || true ;;
    dispatch) python3 benchmarks/bench_dispatch.py --device cuda --json "$LOGS/bench_dispatch.json" 2>&1 | tee "$LOGS/bench_dispatch.log" ;;
    check)    mla_core_cli check --device cuda 2>&1 | tee "$LOGS/check.log" ;;
    probes)   # every standalone probe (decode Y/Z/Z3/F, sparse B/B2/E/S, prefill), each log in $OUT, then ncu of the
              # library's WGMMA decode; the probes build with nvcc alone (~30 s each)
      for probe in decode_probe_z sparse_probe prefill_probe; do
        timeout "${PROBE_TIMEOUT:-330}" bash "benchmarks/probes/run_$probe.sh" >"$OUT/$probe.log" 2>&1
        echo "$probe: exit $? ($(grep -cE 'PASS' "$OUT/$probe.log") PASS lines, $(grep -cE 'FAIL' "$OUT/$probe.log") FAIL lines)"
        grep -E "ALL PASS|^FAIL|TIMEOUT" "$OUT/$probe.log" | tail -2
      done
      OUT=$OUT timeout "${PROFILE_TIMEOUT:-300}" bash benchmarks/probes/profile_wgmma_kernels.sh 2>&1 | tail -40 ;;
    cuda)     # the CUDA C++ backend: build (timed), its GPU tests, memcheck of a small workload, its mutants
      { time python3 -c "from mla_core_cuda import build; print(build.build(verbose=True).__file__)"; } 2>&1 | tee "$LOGS/cuda_build.log" | tail -4
      python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 tests/test_cuda_decode.py tests/test_cuda_build.py 2>&1 | tee "$LOGS/cuda_tests.log" | tail -15
      /usr/local/cuda/bin/compute-sanitizer --tool memcheck python3 -m mla_core_cuda.sanitize 2>&1 | tee "$LOGS/cuda_memcheck.log" | tail -3
      python3 tests/mutation/mutants_cuda.py 2>&1 | tee "$LOGS/cuda_mutants.log" | tail -12 ;;
    warmup)
      cache=$(mktemp -d)
      # WARMUP_FRESH=1: an empty Triton cache, as on a machine that has compiled nothing yet
      triton_cache=${TRITON_CACHE_DIR:-}; [ "${WARMUP_FRESH:-0}" = 1 ] && triton_cache=$(mktemp -d)
      for tp in ${WARMUP_TP:-8}; do
        ( export MLA_CORE_CACHE_DIR=$cache; [ -n "$triton_cache" ] && export TRITON_CACHE_DIR=$triton_cache
          time timeout "${WARMUP_TIMEOUT:-600}" "${CLI[@]}" warmup --model deepseek-v3 --tp "$tp" --no-progress ${WARMUP_ARGS:-} ) 2>&1 \
          | tee "$OUT/warmup_tp$tp.log" | tail -12
      done
      # the CUDA build's per-unit times inside the warm-up (ninja's log: start / end ms, one line per object)
      for log in "$cache"/build/*/.ninja_log; do [ -f "$log" ] && cp "$log" "$OUT/warmup_ninja_log.txt"; done
      MLA_CORE_CACHE_DIR=$cache mla_core_cli cache export "$OUT/NVIDIA_H200.json" ;;
    tp2)      # on a 2-GPU machine: MLAAttention TP=2 vs TP=1 (test at small sizes, then the decode-step benchmark)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast here
      python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_tensor_parallel.py 2>&1 | tail -5
      torchrun --standalone --nproc-per-node 2 benchmarks/bench_tp.py ${TP_ARGS:-} 2>&1 | tee "$OUT/bench_tp.log" | tail -12 ;;
    sync2)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast here
      nvidia-smi -L
      MLA_CORE_CACHE_DIR=$(mktemp -d) torchrun --nproc-per-node 2 -m mla_core.cli warmup --model deepseek-v3 --tp 8 \
        --ops decode,merge --batch 1,32 --lengths 4096 --prefill-lengths 1024 --recipes bf16,fp8 --force --no-progress \
        2>&1 | tee "$LOGS/sync2.log" | tail -40 ;;
    *) echo "unknown step $step" ;;
  esac
done
tar czf "$OUT/logs.tgz" -C "$LOGS" .
