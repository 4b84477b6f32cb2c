"""Fake backends for the autotuner tests: a slow one, a fast one with two configs, a fast-but-wrong one, an exact judge.

All run ``merge`` on the CPU with plain torch math; speed differences are sleeps, far apart, so the
ranking holds on a loaded 2-core CI machine (sleeping is not slowed by CPU contention, only delayed). ``install()`` registers them once per process (through
``mla_core.register_plugin``, as a third-party plugin would) and returns them by name.
"""
import time

import torch

import mla_core
from mla_core import OpCapability
from mla_core.plugins import registry

NAMES = ("tt_slow", "tt_fast", "tt_wrong", "tt_exact")


def merge_math(call):
    lse = torch.logaddexp(call.prefix_lse, call.suffix_lse)
    wa = torch.exp(call.prefix_lse - lse).nan_to_num(0.0).T[..., None]
    wb = torch.exp(call.suffix_lse - lse).nan_to_num(0.0).T[..., None]
    out = (wa * call.prefix_output.float() + wb * call.suffix_output.float())
    dtype = call.output.dtype if call.output is not None else call.prefix_output.dtype
    return out.to(dtype).contiguous(), lse  # results are contiguous (the dispatcher checks)


class _Fake(mla_core.Backend):
    device_types = frozenset({"cpu"})
    capabilities = {"merge": OpCapability()}
    sleep_s = 0.0

    def configs(self, problem):
        return [{}]

    def merge(self, call, config):
        time.sleep(config.get("sleep_s", self.sleep_s))
        return merge_math(call)


class Slow(_Fake):
    name, version, priority, sleep_s = "tt_slow", "1", 100, 0.016


class Fast(_Fake):
    name, version, priority = "tt_fast", "1", 10

    def configs(self, problem):
        return [{"sleep_s": 0.006}, {"sleep_s": 0.001}]


class Wrong(_Fake):
    name, version, priority = "tt_wrong", "1", 1

    def merge(self, call, config):
        # wrong, and the fastest by far: no math at all, so CPU contention cannot push it past tt_fast's 1 ms sleep
        # (with the merge's math it once timed slower on a loaded CI machine, went unchecked and became runner-up)
        return call.prefix_output.clone(), call.prefix_lse.clone(memory_format=torch.contiguous_format)


class Exact(_Fake):
    name, version, priority, sleep_s = "tt_exact", "1", 0, 0.024


class _Plugin:
    @mla_core.hookimpl
    def mla_core_backends(self):
        return [Slow(), Fast(), Wrong(), Exact()]


_installed: dict = {}


def install() -> dict:
    """Register the fakes (through ``mla_core.register_plugin``, so they pass the registry's checks) and return them
    by name. They are taken out of the process-wide registry again at once: a test that wants them installs them
    itself (``fake_world``), and later tests (``mla-core check``) never meet a deliberately wrong backend."""
    if not _installed:
        reg = registry()
        plugin = _Plugin()
        added = mla_core.register_plugin(plugin, name="autotune_fakes")
        assert [b.name for b in added] == list(NAMES), reg.broken
        for name in NAMES:
            _installed[name] = reg.backends.pop(name)
            reg.owner.pop(name, None)
        reg.pm.unregister(plugin)
    return dict(_installed)


def merge_problem(tokens: int = 64, heads: int = 4, head_dim: int = 32) -> mla_core.Problem:
    return mla_core.Problem.make("merge", "cpu", dtype="float32", out_dtype="float32", heads=heads, head_dim=head_dim,
                                 tokens=tokens)
