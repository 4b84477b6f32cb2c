"""Compare the PTX entry functions of two compiles of one .cu file, labels and the anonymous-namespace hash aside.

    nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -ptx -o a.ptx <old>/csrc/mla_decode_wgmma.cu
    nvcc ... -ptx -o b.ptx <new>/csrc/mla_decode_wgmma.cu
    python3 benchmarks/probes/ptx_entries_diff.py a.ptx b.ptx      # SAME / DIFFER per entry (compile without -lineinfo)
"""
from __future__ import annotations

import re
import sys


def entries(path: str) -> dict[str, str]:
    """Entry name -> its PTX text, with `$L__` labels and the `_GLOBAL__N__<hash>_<n>_<file>_cu_<hash>` prefix
    (which depends on the file's path and contents) replaced by placeholders."""
    text = open(path).read()
    text = re.sub(r"_GLOBAL__N__[0-9a-f]{8}_\d+_(\w+?)_cu_[0-9a-f]{8}", r"ANON_\1_", text)
    text = re.sub(r"\$L__\w+", "L", text)
    parts = re.split(r"(?=^(?:\.visible |\.weak )?\.entry)", text, flags=re.M)
    return {re.match(r".*?\.entry\s+(\S+?)\(", p, flags=re.S).group(1): p for p in parts[1:]}


def main() -> int:
    a, b = entries(sys.argv[1]), entries(sys.argv[2])
    differ = 0
    for name in sorted(set(a) | set(b)):
        short = re.sub(r"^.*?ANON_\w+?_\d+", "", name)
        if name not in a or name not in b:
            print("ONLY-ONE", short)
            differ += 1
            continue
        same = a[name] == b[name]
        differ += not same
        print("SAME  " if same else "DIFFER", short)
    return 0 if differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
