#!/usr/bin/env python3
"""Whether two cubins hold the same machine code, function by function.

Usage: python3 benchmarks/probes/sass_identical.py BEFORE.cubin AFTER.cubin [--text-only]

BEFORE / AFTER may also hold several cubins: an object file, an archive of objects (`ar rcs x.a *.cuda.o`, one per
translation unit) or a shared library; cuobjdump dumps them all, each cubin's header lines are skipped, and a function
name met a second time is kept as "NAME [#2]" (a kernel instantiated in two translation units shows as "only in").

Runs `cuobjdump -sass` on both and compares, per function, the instruction sequence: each instruction's text and
its encoding words (the hex in the /* 0x... */ comments, which carry the scheduling control bits too; --text-only
leaves them out). Ignored: the /*0123*/ offsets, section headers (.headerflags, .text, code for / .target lines),
line info, blank lines, and an anonymous namespace's mangled name (<length>_GLOBAL__N__<hash>_<length>_<file>_<hash>...,
dropped whole: it follows the source's file name, path and contents, so a copy of the tree elsewhere, or the same
kernel instantiated from another file, gets another). Prints one line per function
(equal / differs / only in one), the first differing instruction of a function that differs, and exits 1 if any
function differs or stands in one cubin only, 2 if cuobjdump fails.

cuobjdump: $CUOBJDUMP, else on PATH, else $CUDA_HOME/bin, else the one Triton ships.
"""
import os
import re
import shutil
import subprocess
import sys

ANON = re.compile(r"(\d+)_GLOBAL__N_")


def strip_anon(name):
    """``name`` with each anonymous namespace's <length><source-name> replaced by ``_GLOBAL__N_``: the length
    (the digits before it, the longest run that ends the name right before the next <length><identifier> or E)
    says where the namespace's name ends."""
    out, pos = [], 0
    for m in ANON.finditer(name):
        if m.start() < pos:
            continue
        digits = m.group(1)
        for k in range(len(digits)):  # the longest digit run first; a shorter one if the previous token ended in digits
            length = int(digits[k:])
            end = m.start(1) + len(digits) + length
            if end <= len(name) and (end == len(name) or name[end].isdigit() or name[end] in "EIS"):
                out.append(name[pos:m.start(1) + k] + "_GLOBAL__N_")
                pos = end
                break
    return "".join(out) + name[pos:]
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
            name = strip_anon(s.split(":", 1)[1].strip())
            base, n = name, 1
            while name in out:  # the same function in another cubin of the file
                n += 1
                name = f"{base} [#{n}]"
            cur = out.setdefault(name, [])
            continue
        if s.startswith(("member ", "Fatbin ")):  # the next cubin: its header lines precede its first function
            cur = None
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
