# Shared by the run_*_probe.sh scripts (sourced after they cd here and set NVCC and BIN).
# probe_build SRC: prints the commit, nvcc and GPU lines, then builds SRC into $BIN with ptxas's report in
# $BIN.ptxas.log; on a failed build prints that log and exits 2.
probe_build() {
  echo "commit ${MLA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}; $("$NVCC" --version | tail -1)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader \
    2>/dev/null || true
  if ! "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$BIN" "$1" \
      >"$BIN.ptxas.log" 2>&1; then
    cat "$BIN.ptxas.log"
    echo "BUILD FAILED"
    exit 2
  fi
}
# probe_kernels: one line per kernel from $BIN.ptxas.log: its name, stack / spills, registers / barriers.
probe_kernels() {
  grep -A3 "Compiling entry" "$BIN.ptxas.log" | grep -E "entry|registers|spill" \
    | sed -E "s/.*Compiling entry function '([^']+)'.*/kernel \1:/; s/ptxas info *: //; s/^ +//" | paste -d' ' - - -
}
# probe_clocks: the GPU's clock, power and temperature after the run.
probe_clocks() {
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null || true
}
