# Sourced by the device scripts, from the repository root: this checkout's packages first on PYTHONPATH, the
# plugins' entry points declared by hand (a dist-info folder beside them), so `import mla_core` and its plugins
# come from this tree even where a warm device machine still holds another tree's editable install.
_mla_ep=$(mktemp -d); mkdir -p "$_mla_ep/mla_core-0.1.0.dist-info"
printf 'Metadata-Version: 2.1\nName: mla-core\nVersion: 0.1.0\n' >"$_mla_ep/mla_core-0.1.0.dist-info/METADATA"
printf '[mla_core]\nreference = mla_core_reference.plugin\ntriton = mla_core_triton.plugin\ncuda = mla_core_cuda.plugin\nmusa_fp8 = mla_core_musa_fp8.plugin\ncudnn = mla_core_cudnn.plugin\n' \
  >"$_mla_ep/mla_core-0.1.0.dist-info/entry_points.txt"
export PYTHONPATH="$PWD:$PWD/backends/reference:$PWD/backends/triton:$PWD/backends/cuda:$PWD/backends/musa_fp8:$PWD/backends/cudnn:$_mla_ep${PYTHONPATH:+:$PYTHONPATH}"
