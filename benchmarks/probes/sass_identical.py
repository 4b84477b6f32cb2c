#!/usr/bin/env python3
"""Whether two cubins hold the same machine code, function by function.

Usage: python3 benchmarks/probes/sass_identical.py BEFORE.cubin AFTER.cubin [--text-only]

Runs `cuobjdump -sass` on both and compares, per function, the instruction sequence: each instruction's text and
its encoding words (the hex in the /* 0x... */ comments, which carry the scheduling control bits too; --text-only
leaves them out). Ignored: the /*0123*/ offsets, section headers (.headerflags, .text, code for / .target lines),
line info, blank lines, and the hash in an anonymous namespace's mangled name (_GLOBAL__N__<hash>_<file>_<hash>: it
follows the source's path and contents, so a copy of the tree elsewhere gets another). Prints one line per function
(equal / differs / only in one), the first differing instruction of a function that differs, and exits 1 if any
function differs or stands in one cubin only, 2 if cuobjdump fails.

cuobjdump: $CUOBJDUMP, else on PATH, else $CUDA_HOME/bin, else the one Triton ships.
"""
import os
import re
import shutil
import subprocess
import sys

ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}")
OFFSET = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*")
ENCODING = re.compile(r"/\*\s*(0x[0-9a-f]{16})\s*\*/")


def find_cuobjdump():
    cands = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    if os.environ.get("CUDA_HOME"):
        cands.append(os.path.join(os.environ["CUDA_HOME"], "bin", "cuobjdump"))
    try:
        import triton  # noqa: F401  (only for the path of its bundled tools)

        cands.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except Exception:
        pass
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("sass_identical: no cuobjdump found (set CUOBJDUMP)")


def functions(cubin, text_only):
    """{function name (anonymous-namespace hash removed): [(instruction, encodings)]}"""
    r = subprocess.run([find_cuobjdump(), "-sass", cubin], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        sys.exit(2)
    out, name, cur = {}, None, None
    for line in r.stdout.splitlines():
        s = line.strip()
        if s.startswith("Function :"):
            name = ANON.sub("_GLOBAL__N_", s.split(":", 1)[1].strip())
            cur = out.setdefault(name, [])
            continue
        if cur is None or not s or s.startswith(".") or s.startswith("code for") or s.startswith("//"):
            continue
        enc = ENCODING.findall(s)
        text = ENCODING.sub("", OFFSET.sub("", s)).strip()
        if text:  # an instruction line (its first encoding word follows on the line)
            cur.append([text, enc])
        elif enc and cur:  # the second encoding word on a line of its own
            cur[-1][1].extend(enc)
    return {k: [(t, () if text_only else tuple(e)) for t, e in v] for k, v in out.items()}


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    text_only = "--text-only" in argv
    a, b = functions(args[0], text_only), functions(args[1], text_only)
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"only in {'after' if name not in a else 'before'}: {name}")
            bad += 1
            continue
        fa, fb = a[name], b[name]
        if fa == fb:
            print(f"equal    ({len(fa)} instructions): {name}")
            continue
        bad += 1
        i = next((i for i, (x, y) in enumerate(zip(fa, fb)) if x != y), min(len(fa), len(fb)))
        print(f"differs  ({len(fa)} vs {len(fb)} instructions, first at #{i}): {name}")
        print(f"    before: {fa[i] if i < len(fa) else '(end)'}")
        print(f"    after:  {fb[i] if i < len(fb) else '(end)'}")
    print(f"{len(set(a) | set(b))} functions, {bad} differ" if bad else f"{len(a)} functions, all equal")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
