"""The example backend against mla_core's reference: the conformance suite, and the public op through dispatch."""
import torch

import mla_core
from mla_core.testing import check_backend


def test_installed_through_the_entry_point():
    assert "example" in mla_core.backends(), "install the plugin first: pip install -e ."


def test_conformance():
    """Every declared op on awkward shapes, poisoned buffers, empty rows, every config (raises with a report)."""
    report = check_backend("example")
    assert report.counts()["pass"] > 0


def test_public_op_runs_on_this_backend():
    torch.manual_seed(0)
    tokens, heads, dim = 7, 2, 16
    args = dict(prefix_output=torch.randn(tokens, heads, dim), prefix_lse=torch.randn(heads, tokens),
                suffix_output=torch.randn(tokens, heads, dim), suffix_lse=torch.randn(heads, tokens))
    out, lse = mla_core.merge_attn_states(**args, backend="example")
    ref, ref_lse = mla_core.merge_attn_states(**args, backend="reference")
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)
