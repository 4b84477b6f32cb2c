"""The cuda backend's Python side on any machine: capabilities, why not on CPU, the build key, the private
build folder, and the build-error path (a fake compiler that fails: the backend becomes unavailable with the
compiler's first error line, never a crash)."""
from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import pytest
import torch

import mla_core
from mla_core_cuda import backend as cuda_backend
from mla_core_cuda import build
from mla_core_cuda import decode as cuda_decode


def _problem(**kw):
    base = dict(dtype="bfloat16", q_dtype="bfloat16", out_dtype="bfloat16", heads=16, kv_lora_rank=512, rope_dim=64,
                page_size=64, num_kv_splits=32, k_qdq=None, v_qdq=None, p_qdq=None, batch=1, max_len=4096)
    base.update(kw)
    return mla_core.Problem.make("decode", "cuda", {"lse"}, **base)


def test_registered_and_capabilities():
    backend = mla_core.get_backend("cuda")
    cap = backend.capabilities["decode"]
    assert set(backend.capabilities) == {"decode", "sparse_decode", "prefill"}  # tests/test_cuda_{sparse,prefill}.py
    assert cap.why_not(_problem()) == []
    assert cap.why_not(_problem(heads=128, k_qdq="nvfp4", v_qdq="fp8", p_qdq="nvfp4", page_size=1)) == []
    assert cap.why_not(_problem(dtype="float16", q_dtype="float16", out_dtype="float32")) == []
    assert any("heads" in r for r in cap.why_not(_problem(heads=129)))
    assert any("kv_lora_rank" in r for r in cap.why_not(_problem(kv_lora_rank=256)))
    assert any("rope_dim" in r for r in cap.why_not(_problem(rope_dim=32)))
    assert any("dtype" in r for r in cap.why_not(_problem(dtype="float32", q_dtype="float32")))
    problem = mla_core.Problem.make("decode", "cuda", {"lse", "fp32_q"}, **{**dict(_problem().params),
                                                                             "q_dtype": "float32"})
    assert cap.why_not(problem)  # the caller-quantized fp32 q is not supported (yet)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour")
def test_why_not_on_cpu():
    backend = cuda_backend.CudaBackend()
    assert backend.unavailable_reason() == "no CUDA device"
    assert backend.why_not(_problem()) == ["unavailable: no CUDA device"]
    assert backend.info()["available"] is False


def _shapes(configs):
    return [(c["head_tiles"], c["warps"]) for c in configs if "kernel" not in c]


def test_configs():
    assert cuda_decode.configs(_problem(heads=16)) == [{"kernel": "wgmma"}, {"kernel": "keys_m"},
                                                       {"head_tiles": 1, "warps": 4}]
    assert cuda_decode.configs(_problem(heads=16, p_qdq="fp8")) == [{"kernel": "wgmma"}, {"head_tiles": 1, "warps": 4}]
    assert cuda_decode.configs(_problem(heads=128, k_qdq="fp8"))[0] == {"head_tiles": 4, "warps": 8}
    assert cuda_decode.configs(_problem(heads=32, v_qdq="nvfp4"))[0] == {"head_tiles": 2, "warps": 8}
    for heads in (16, 32, 64, 128):
        assert all(s in cuda_decode.SHAPES for s in _shapes(cuda_decode.configs(_problem(heads=heads))))
    # the four-slot ring (schedule Q1, bit-equal): unquantized bf16 / fp16 at >= 64 heads only, right after the default
    rings = [{"kernel": "wgmma"}, {"kernel": "ring4"}]
    for heads in (64, 65, 128, 256):
        assert cuda_decode.configs(_problem(heads=heads))[:2] == rings
        assert cuda_decode.configs(_problem(heads=heads, dtype="float16", q_dtype="float16"))[:2] == rings
        assert [c for c in cuda_decode.configs(_problem(heads=heads)) if c.get("kernel") == "ring4"] == rings[1:]
    assert [c for c in cuda_decode.configs(_problem(heads=128, num_kv_splits="auto"))
            if c.get("kernel") == "ring4"] == rings[1:]  # no split variants of its own
    for problem in (_problem(heads=63), _problem(heads=16), _problem(heads=128, p_qdq="fp8"),
                    _problem(heads=128, k_qdq="fp8", v_qdq="fp8"), _problem(heads=128, p_qdq="nvfp4"),
                    _problem(heads=128, dtype="float8_e4m3fn"), _problem(heads=128, q_dtype="float16")):
        assert not [c for c in cuda_decode.configs(problem) if str(c.get("kernel", "")).startswith("ring")]
    auto = cuda_decode.configs(_problem(heads=16, num_kv_splits="auto"))
    assert {c.get("num_kv_splits") for c in auto} == {None, 1, 2, 4, 8, 16, 32}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("heads", [1, 16, 20, 64, 96, 128])
def test_wgmma_config_first_where_it_covers(heads, dtype):
    """The WGMMA kernel leads (the default, first timed) for unquantized bf16/fp16 at any head count (the last
    64-head group zero-padded), every mma.sync shape still follows; with "auto" the split counts are tuned for it."""
    problem = _problem(heads=heads, dtype=dtype, q_dtype=dtype, out_dtype="float32", page_size=1)
    configs = cuda_decode.configs(problem)
    assert configs[0] == {"kernel": "wgmma"} and cuda_decode.wgmma_covers(problem)
    assert _shapes(configs) == ([(1, 4)] if heads <= 16 else [(2, 8), (2, 4), (1, 4)] if heads <= 32
                                else [(4, 8), (2, 8), (2, 4), (1, 4)])
    backend = mla_core.get_backend("cuda")
    assert backend.validate_config(problem, {"kernel": "wgmma"}) == []
    auto = _problem(heads=heads, dtype=dtype, q_dtype=dtype, num_kv_splits="auto")
    assert [c for c in cuda_decode.configs(auto) if "num_kv_splits" in c] == [
        {"kernel": k, "num_kv_splits": s} for k in (("wgmma", "keys_m") if heads <= 16 else ("wgmma",))
        for s in (1, 2, 4, 8, 16, 32)]
    assert backend.validate_config(auto, {"kernel": "wgmma", "num_kv_splits": 7}) == []


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("heads", [1, 8, 16])
def test_keys_m_config_listed_second(heads, dtype):
    """The keys-as-M config follows the WGMMA one (the default stays first) for an unquantized bf16 / fp16 cache at
    <= 16 heads, is valid there (with "auto" its split counts too) and runs one CTA per SM."""
    problem = _problem(heads=heads, dtype=dtype, q_dtype=dtype)
    configs = cuda_decode.configs(problem)
    assert configs[:2] == [{"kernel": "wgmma"}, {"kernel": "keys_m"}] and cuda_decode.keys_m_covers(problem)
    backend = mla_core.get_backend("cuda")
    assert backend.validate_config(problem, {"kernel": "keys_m"}) == []
    auto = _problem(heads=heads, dtype=dtype, q_dtype=dtype, num_kv_splits="auto")
    assert backend.validate_config(auto, {"kernel": "keys_m", "num_kv_splits": 8}) == []


@pytest.mark.parametrize("kw", [dict(heads=17), dict(heads=128), dict(heads=16, p_qdq="fp8"),
                                dict(heads=16, p_qdq="nvfp4"), dict(heads=8, k_qdq="fp8", v_qdq="fp8"),
                                dict(heads=16, k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4"),
                                dict(heads=16, dtype="float8_e4m3fn"), dict(heads=16, dtype="float32", q_dtype="float32"),
                                dict(heads=16, dtype="float16", q_dtype="bfloat16")])
def test_keys_m_config_only_where_it_covers(kw):
    """More than 16 heads, any fake quantization, an FP8 cache (its own keys-as-M kernel runs under the WGMMA
    config), a float32 cache or q of another dtype: the keys-as-M config is neither listed nor accepted."""
    problem = _problem(**kw)
    assert not cuda_decode.keys_m_covers(problem)
    assert all(c.get("kernel") != "keys_m" for c in cuda_decode.configs(problem))
    assert mla_core.get_backend("cuda").validate_config(problem, {"kernel": "keys_m"})


@pytest.mark.parametrize("kw", [dict(heads=64, p_qdq="fp8"), dict(heads=16, p_qdq="nvfp4"),
                                dict(heads=128, k_qdq="fp8", v_qdq="fp8", p_qdq="fp8"),
                                dict(heads=20, k_qdq="fp8", v_qdq="fp8", p_qdq="nvfp4"), dict(heads=1, k_qdq="fp8", v_qdq="fp8")])
def test_wgmma_config_first_for_shared_kv_codes(kw):
    """The recipes whose K and V give the same values on the shared columns (both off or both FP8), with P in any
    format, get the WGMMA config first."""
    problem = _problem(**kw)
    assert cuda_decode.wgmma_covers(problem) and cuda_decode.configs(problem)[0] == {"kernel": "wgmma"}
    assert mla_core.get_backend("cuda").validate_config(problem, {"kernel": "wgmma"}) == []


@pytest.mark.parametrize("kw", [dict(heads=16, dtype="float32", q_dtype="float32"), dict(heads=128, k_qdq="fp8"), dict(heads=128, v_qdq="nvfp4"),
                                dict(heads=64, k_qdq="fp8", v_qdq="nvfp4", p_qdq="fp8"), dict(heads=64, v_qdq="fp8"),
                                dict(heads=128, k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4")])
def test_wgmma_config_only_where_it_covers(kw):
    """A float32 cache and every recipe whose K and V differ on the shared columns (NVFP4 anywhere in K or V, one
    of them unquantized) never get the WGMMA config (listed or accepted)."""
    problem = _problem(**kw)
    assert not cuda_decode.wgmma_covers(problem)
    assert all(c.get("kernel") != "wgmma" for c in cuda_decode.configs(problem))
    assert mla_core.get_backend("cuda").validate_config(problem, {"kernel": "wgmma"})
    assert mla_core.get_backend("cuda").validate_config(problem, {"kernel": "wgmma", "head_tiles": 4, "warps": 8})


def test_bindings_build_refusal_messages_without_ostream():
    """Every check of csrc/bindings.cpp goes through MLA_CHECK (its message by string concatenation): a TORCH_CHECK
    that formats a number dies with SIGSEGV on the lent H200's toolchain instead of raising (round q)."""
    text = (build.source_dir() / "bindings.cpp").read_text()
    code = re.sub(r"//[^\n]*", "", text)
    assert re.findall(r"\bTORCH_CHECK\(", code) == ["TORCH_CHECK("]  # the one inside MLA_CHECK's definition
    assert "#define MLA_CHECK(cond, ...) TORCH_CHECK(cond, message(__VA_ARGS__))" in code
    assert code.count("MLA_CHECK(") > 50 and "c10::str" not in code and "ostream" not in code


REFUSALS = """
import torch
from mla_core_cuda import build
m = build.build()
t = torch.zeros(4, 1, 192, dtype=torch.bfloat16, device="cuda")
v = torch.zeros(4, 1, 128, dtype=torch.bfloat16, device="cuda")
cu = torch.tensor([0, 4], dtype=torch.int32, device="cuda")
for p_fmt in (9, -1):  # refused by prefill_wgmma_supported: a message with the strides and the p_fmt check
    try:
        m.prefill_wgmma(t, t, v, cu, cu, 4, v.clone(), None, True, 0.1, 1.0, p_fmt, 1.0, 1.0, 0, 1.0, 1.0)
    except RuntimeError as e:
        print("raised:", str(e).splitlines()[0])
    else:
        print("not refused")
"""


@pytest.mark.gpu
def test_gpu_binding_refusals_raise():
    """A call the binding refuses raises RuntimeError with the numbers in its message; the process lives (run in a
    subprocess, so a crash fails this test instead of killing pytest)."""
    r = subprocess.run([sys.executable, "-c", REFUSALS], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"the process died (rc {r.returncode}): {r.stderr[-2000:]}"
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2 and all(x.startswith("raised:") for x in lines), r.stdout
    assert "got strides q [192, 192, 1], k [192, 192, 1], v [128, 128, 1]" in lines[0], lines[0]


def test_build_key():
    src = {"a.cu": b"kernel", "b.h": b"header"}
    versions = dict(torch_version="2.11.0", cuda_version="13.0", nvcc_version="release 13.0, V13.0.48")
    key = build.build_key(src, **versions)
    assert len(key) == 16 and int(key, 16) >= 0
    assert build.build_key(dict(src), **versions) == key  # deterministic
    assert build.build_key({**src, "a.cu": b"kernel "}, **versions) != key  # any source byte
    assert build.build_key({**src, "c.cu": b""}, **versions) != key  # a new file
    for name, other in (("torch_version", "2.13.0"), ("cuda_version", "12.8"), ("nvcc_version", "release 12.8")):
        assert build.build_key(src, **{**versions, name: other}) != key, name


def test_build_key_covers_flags(monkeypatch):
    src = {"a.cu": b"kernel"}
    versions = dict(torch_version="2.11.0", cuda_version="13.0", nvcc_version="13.0")
    key = build.build_key(src, **versions)
    monkeypatch.setattr(build, "CUDA_FLAGS", build.CUDA_FLAGS + ("-DX",))
    assert build.build_key(src, **versions) != key
    monkeypatch.undo()
    monkeypatch.setattr(build, "ARCH", "sm_100a")
    assert build.build_key(src, **versions) != key


def test_real_sources_found():
    src = build.source_dir()
    assert (src / "mla_decode.cu").is_file() and (src / "bindings.cpp").is_file()
    assert len(build.build_key(torch_version="x", cuda_version="y", nvcc_version="z")) == 16


def test_wgmma_source_built_and_keyed(monkeypatch, tmp_path):
    """The WGMMA kernel's source is compiled (SOURCES), for sm_90a, and any change to it changes the key."""
    assert "mla_decode_wgmma.cu" in build.SOURCES and "-gencode=arch=compute_90a,code=sm_90a" in build.CUDA_FLAGS
    src = tmp_path / "csrc"
    src.mkdir()
    for name in build.SOURCES + build.HEADERS:
        (src / name).write_bytes((build.source_dir() / name).read_bytes())
    monkeypatch.setenv("MLA_CORE_CUDA_SRC", str(src))
    monkeypatch.setattr(build, "_DEFAULT_KEY", None)
    key = build.build_key(torch_version="x", cuda_version="y", nvcc_version="z")
    (src / "mla_decode_wgmma.cu").write_bytes((src / "mla_decode_wgmma.cu").read_bytes() + b"\n")
    assert build.build_key(torch_version="x", cuda_version="y", nvcc_version="z") != key
    (src / "mla_decode_wgmma.cu").unlink()
    with pytest.raises(build.BuildError, match="not found"):
        build.source_dir()


def test_source_override(monkeypatch, tmp_path):
    """MLA_CORE_CUDA_SRC builds another copy of csrc/ (mutation tests); its sources change the key."""
    src = tmp_path / "csrc"
    src.mkdir()
    for name in build.SOURCES + build.HEADERS:
        (src / name).write_bytes((build.source_dir() / name).read_bytes())
    monkeypatch.setattr(build, "_DEFAULT_KEY", None)
    key = build.build_key(torch_version="x", cuda_version="y", nvcc_version="z")
    monkeypatch.setenv("MLA_CORE_CUDA_SRC", str(src))
    assert build.source_dir() == src
    assert build.build_key(torch_version="x", cuda_version="y", nvcc_version="z") == key
    (src / "mla_decode.cu").write_text("// mutated\n")
    assert build.build_key(torch_version="x", cuda_version="y", nvcc_version="z") != key
    monkeypatch.setenv("MLA_CORE_CUDA_SRC", str(tmp_path / "missing"))
    with pytest.raises(build.BuildError, match="MLA_CORE_CUDA_SRC"):
        build.source_dir()


def test_pre_split_source_override(monkeypatch, tmp_path):
    """A csrc/ from before the decode kernels' split (an A/B base snapshot: no mla_decode_wgmma.cuh, the kernels in
    mla_decode.cu and mla_decode_wgmma.cu) is still found through MLA_CORE_CUDA_SRC and built and keyed with its
    own translation units; a split tree missing one of its units is not taken for one."""
    src = tmp_path / "csrc"
    src.mkdir()
    for name in build.PRE_SPLIT_SOURCES + build.HEADERS:
        if not name.startswith(("mla_decode_wgmma", "mla_decode_mma")):
            (src / name).write_text(f"// {name}\n")
    (src / "mla_decode_wgmma.cu").write_text("// the WGMMA decode, one unit\n")
    monkeypatch.setenv("MLA_CORE_CUDA_SRC", str(src))
    monkeypatch.setattr(build, "_DEFAULT_KEY", None)
    assert build.source_dir() == src
    units, headers = build.layout(src)
    assert units == build.PRE_SPLIT_SOURCES and "mla_decode_wgmma.cuh" not in headers and "seesaw.cuh" in headers
    key = build.build_key(torch_version="x", cuda_version="y", nvcc_version="z")
    (src / "mla_decode_wgmma.cu").write_text("// changed\n")
    assert build.build_key(torch_version="x", cuda_version="y", nvcc_version="z") != key
    split = tmp_path / "split"
    split.mkdir()
    for name in build.SOURCES + build.HEADERS:
        (split / name).write_text(f"// {name}\n")
    assert build.layout(split) == (build.SOURCES, build.HEADERS)
    (split / "mla_decode_wgmma_fp16_kv.cu").unlink()
    assert build.layout(split) is None


def _split_without(tmp_path, *groups):
    """A csrc/ folder of empty files: every unit and header but those of ``groups``."""
    split = tmp_path / "split"
    split.mkdir()
    missing = {name for group in groups for name in group}
    for name in build.SOURCES + build.HEADERS:
        if name not in missing:
            (split / name).write_text(f"// {name}\n")
    return split


@pytest.mark.parametrize("group", build.OPTIONAL_FILES, ids=lambda group: group[0])
def test_split_source_without_an_optional_group(tmp_path, group):
    """A split csrc/ from before one of the later additions (``OPTIONAL_FILES``: the layer's CUDA prep, the
    persistent prefill, the decode's ring4 units; main's csrc/ as an A/B base) builds without that group; part of a
    group is not a csrc/ folder."""
    assert set(group) <= set(build.SOURCES + build.HEADERS)
    split = _split_without(tmp_path, group)
    units, headers = build.layout(split)
    assert not set(units + headers) & set(group) and "bindings.cpp" in units
    assert len(units) + len(headers) == len(build.SOURCES) + len(build.HEADERS) - len(group)
    (split / group[0]).write_text("// part of it\n")
    assert build.layout(split) is None
    for name in group[1:]:
        (split / name).write_text("// the rest\n")
    assert build.layout(split) == (build.SOURCES, build.HEADERS)


def test_split_source_without_two_optional_groups(tmp_path):
    """The persistent prefill and the layer prep both absent (main's csrc/ at round m): it builds without either."""
    split = _split_without(tmp_path, build.PERSISTENT_PREFILL_FILES, build.LAYER_PREP_FILES)
    units, headers = build.layout(split)
    assert len(units) == len(build.SOURCES) - 2 and len(headers) == len(build.HEADERS) - 2


def test_cache_dir_private(monkeypatch, tmp_path):
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path / "deep" / "cache"))
    d = build.build_dir("0123456789abcdef")
    assert d == tmp_path / "deep" / "cache" / "build" / "0123456789abcdef"
    for p in (d, d.parent, d.parent.parent, d.parent.parent.parent):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    monkeypatch.delenv("MLA_CORE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_root() == tmp_path / "xdg" / "mla_core"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert build.cache_root() == tmp_path / "home" / ".cache" / "mla_core"


def test_cache_dir_refuses_shared(monkeypatch, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(shared))
    with pytest.raises(build.BuildError, match="writable by group or others"):
        build.build_dir("0123456789abcdef")
    os.chmod(shared, 0o700)
    (shared / "build").mkdir(mode=0o700)
    os.chmod(shared / "build", 0o775)
    with pytest.raises(build.BuildError, match="writable by group or others"):
        build.build_dir("0123456789abcdef")


def test_first_error():
    log = ("Error building extension 'x': [1/3] c++ -c a.cpp\nFAILED: a.o\n"
           "/tmp/a.cu(12): warning #177-D: unused\n/tmp/a.cu(40): error: identifier \"foo\" is undefined\n"
           "/tmp/a.cu(41): error: second\nninja: build stopped: subcommand failed.\n")
    assert build.first_error(log) == '/tmp/a.cu(40): error: identifier "foo" is undefined'
    assert build.first_error("a.cpp:3:10: fatal error: x.h: No such file\n") == "a.cpp:3:10: fatal error: x.h: No such file"
    assert build.first_error("something odd\n") == "something odd"
    assert build.first_error("") == "build failed with no output"


@pytest.fixture
def fake_compilers(monkeypatch, tmp_path):
    """nvcc and c++ that fail with a planted error (nvcc --version answers), in a fresh private cache."""
    from torch.utils import cpp_extension
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    script = ("#!/bin/sh\n"
              "if [ \"$1\" = \"--version\" ]; then echo 'Cuda compilation tools, release 99.9, V99.9.1'; exit 0; fi\n"
              "echo 'planted.cu(7): error: planted compiler failure' >&2\nexit 1\n")
    for name in ("nvcc", "c++"):
        (home / "bin" / name).write_text(script)
        (home / "bin" / name).chmod(0o755)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(home))
    monkeypatch.setenv("CXX", str(home / "bin" / "c++"))
    monkeypatch.setenv("MLA_CORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_LOADED", {})
    monkeypatch.setattr(build, "_FAILED", {})
    monkeypatch.setattr(build, "_DEFAULT_KEY", None)
    return home


def test_build_error_fake_compiler(fake_compilers, monkeypatch, capsys):
    with pytest.raises(build.BuildError, match=r"^planted\.cu\(7\): error: planted compiler failure$"):
        build.build()
    err = capsys.readouterr().err
    assert "building the CUDA kernels" in err  # the progress message
    key = build.build_key()
    assert (build.build_dir(key) / "build_error.log").is_file()
    # The backend turns it into its unavailable reason (remembered), never an exception.
    monkeypatch.setattr(cuda_backend, "device_reason", lambda: None)
    backend = cuda_backend.CudaBackend()
    reason = backend.unavailable_reason()
    assert reason == "build failed: planted.cu(7): error: planted compiler failure"
    assert backend.why_not(_problem()) == [f"unavailable: {reason}"]
    assert backend.info()["reason"] == reason
    assert backend.unavailable_reason() == reason  # remembered: no second build in this process
    assert build._FAILED[key] == "planted.cu(7): error: planted compiler failure"


def test_missing_nvcc(fake_compilers, monkeypatch):
    from torch.utils import cpp_extension
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(build.BuildError, match="nvcc not found"):
        build.build()


def test_mla_core_build_command(fake_compilers, capsys):
    """``mla-core build`` calls the backend's build(verbose): FAILED with the compiler's first error line."""
    from mla_core.cli import main
    backend = mla_core.get_backend("cuda")
    assert backend.build(False) == "build failed: planted.cu(7): error: planted compiler failure"
    assert main(["build", "--backend", "cuda", "--json"]) == 1
    out = capsys.readouterr().out
    assert '"status": "FAILED"' in out and "planted compiler failure" in out


@pytest.mark.parametrize("batch, heads, pages, want", [
    (32, 128, 128, 2), (128, 128, 128, 1), (32, 64, 128, 4), (1, 128, 128, 32), (1, 64, 2, 1), (1, 16, 4, 2),
    (3, 20, 128, 44), (1, 16, 128, 64), (1, 16, 512, 128), (1, 128, 512, 66), (2, 16, 512, 66), (1, 16, 16, 8)])
def test_auto_splits_for_one_cta_per_sm(batch, heads, pages, want):
    """The WGMMA kernel's "auto" split count (one CTA per SM, 132 SMs): the grid stays one wave (rounded down),
    at least two 64-key steps per split and 64-head group, at most 128 splits (numerics.MAX_KV_SPLITS; 32 before
    issue 9: batch 1 at 8k / 32k keys now runs 64 / 128 CTAs at 16 heads, 64 / 132 at 128 heads: 32 / 66 splits);
    pages of 64 tokens."""
    from types import SimpleNamespace
    from mla_core.specs import decode_num_splits
    call = SimpleNamespace(num_kv_splits=None, q=torch.empty(batch, heads, 576, device="meta"),
                           block_table=torch.empty(batch, pages, dtype=torch.int32, device="meta"), page_size=64)
    assert decode_num_splits(call, {}, 132, resident_ctas=1) == want
    assert decode_num_splits(call, {"num_kv_splits": 5}, 132, resident_ctas=1) == 5


@pytest.mark.parametrize("kw, wgmma_first", [
    (dict(heads=128, batch=1), True), (dict(heads=64, batch=32), True), (dict(heads=20, batch=1), True),
    (dict(heads=16, batch=32, num_kv_splits="auto"), True), (dict(heads=16, batch=8, num_kv_splits="auto"), True),
    (dict(heads=16, batch=4, num_kv_splits="auto"), False), (dict(heads=16, batch=128), False),
    (dict(heads=1, batch=1), False), (dict(heads=128, batch=32, p_qdq="fp8"), True),
    (dict(heads=128, batch=32, k_qdq="fp8", v_qdq="fp8", p_qdq="fp8"), True),
    (dict(heads=16, batch=32, k_qdq="fp8", v_qdq="fp8", p_qdq="nvfp4"), False),
    (dict(heads=128, batch=32, k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4"), False),
    (dict(heads=128, batch=32, k_qdq="fp8", v_qdq="nvfp4"), False),
    (dict(heads=128, batch=32, dtype="float32", q_dtype="float32"), False)])
def test_priority_above_triton_where_wgmma_was_faster(kw, wgmma_first, monkeypatch):
    """Dispatch without a tuned entry prefers cuda over triton (200) for decode on the WGMMA kernel (unquantized,
    or K/V both FP8, any P) above 16 heads, and at 16 heads or fewer only with "auto" splits from batch 8 (at the
    default 32 splits triton measured faster there); the recipes the mma.sync kernel runs stay below triton.
    These are the graph-timed rules, for a call being captured; eager calls: tests/test_dispatch_capture.py."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    backend = cuda_backend.CudaBackend()
    triton_priority = mla_core.get_backend("triton").priority
    assert (backend.priority_for(_problem(**kw)) > triton_priority) == wgmma_first
    assert backend.priority < triton_priority


@pytest.mark.parametrize("batch, heads, max_len, wide", [
    (1, 16, 32768, (64, 128)), (1, 128, 32768, (64, 128)), (1, 16, 8192, (64,)), (1, 16, 16384, (64, 128)),
    (2, 16, 32768, (64, 128)), (2, 128, 32768, (64,)), (4, 16, 32768, (64,)), (8, 16, 32768, ()),
    (1, 16, 4096, ()), (1, 128, 8192, ()), (32, 128, 32768, ()), (128, 16, 32768, ())])
def test_auto_lists_wide_splits_only_where_they_fill_the_gpu(batch, heads, max_len, wide):
    """"auto" lists 64 / 128 splits (past the old cap of 32) only where batch x 64-head groups x splits <= 2 x 132
    and each split keeps two 64-key steps per 64-head group of the key's length (128 heads at 8k keys: none, as
    the fill gives 32 there): small-batch long keys; large-batch keys gain none."""
    from mla_core.specs import auto_split_choices
    problem = _problem(heads=heads, batch=batch, max_len=max_len, num_kv_splits="auto")
    assert auto_split_choices(problem) == (1, 2, 4, 8, 16, 32) + wide
    listed = [c["num_kv_splits"] for c in cuda_decode.configs(problem) if c.get("kernel") == "wgmma"
              and "num_kv_splits" in c]
    assert listed == [1, 2, 4, 8, 16, 32, *wide]
    backend = mla_core.get_backend("cuda")
    assert backend.validate_config(problem, {"kernel": "wgmma", "num_kv_splits": 128}) == []
    assert backend.validate_config(problem, {"kernel": "wgmma", "num_kv_splits": 129})
