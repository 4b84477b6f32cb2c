"""MLAAttention's CUDA-graph decode step (``cuda_graph_decode``) on the CPU: keys, fallbacks, check order, copy-in.

The CUDA parts are stood in for: a "graph" whose capture runs the step once (warm-up) and keeps its output as the
static output, and whose replay reruns the step on the static inputs into that output. Everything else (keys, the
checks on the caller's tensors, the copies into the static inputs, the copy of the output) is the real code.
tests/test_layer_graph_gpu.py runs the real CUDA graphs.
"""
from __future__ import annotations

import pytest
import torch

from mla_core.decode_graphs import DecodeGraphs
from mla_core.errors import MLAInputError
from mla_core.nn import MLAAttention

pytest.importorskip("transformers")
from test_nn_transformers import hf_attention, small_config  # noqa: E402

PAGE = 16


class FakeGraphs(DecodeGraphs):
    """DecodeGraphs on the CPU: capture = warm-up + one call; replay = the step again on the static inputs."""

    _on_cuda = staticmethod(lambda t: True)
    _outer_capture = staticmethod(lambda t: False)

    def _capture(self, step, device):
        step()
        output = step()

        def replay():
            output.copy_(step())
        return output, replay


def _modules(max_graphs=4):
    config = small_config()
    state = hf_attention(config, seed=5).state_dict()
    eager = MLAAttention(config, attention_backend="reference")
    graphed = MLAAttention(config, attention_backend="reference")
    for m in (eager, graphed):
        m.load_state_dict(state)
        m.reset_cache(48, PAGE)
    graphed.__dict__["_decode_graphs"] = FakeGraphs(max_graphs)
    graphed.latent_cache.copy_(torch.randn_like(eager.latent_cache))
    eager.latent_cache.copy_(graphed.latent_cache)
    return config, eager, graphed


def _inputs(config, starts, gen):
    """One decode step's caller tensors (fresh objects every call): hidden, offsets, table, lengths."""
    batch = len(starts)
    hidden = torch.randn(batch, config.hidden_size, generator=gen)
    offsets = torch.arange(batch + 1)
    table = torch.arange(batch * 12, dtype=torch.int32).flip(0).view(batch, 12).contiguous()
    return hidden, offsets, table, torch.tensor(starts)


@pytest.mark.parametrize("starts", [[20], [0, 31, 100]])
def test_replay_equals_eager_and_outputs_are_kept(starts):
    """Step by step equal to the eager module (outputs and cache rows), inputs at new addresses every step,
    one capture; the output of step i is unchanged after step i + 1."""
    config, eager, graphed = _modules()
    gen = torch.Generator().manual_seed(0)
    outs, copies = [], []
    with torch.no_grad():
        for step in range(6):
            hidden, offsets, table, lengths = _inputs(config, [s + step for s in starts], gen)
            want = eager(hidden, offsets, table, lengths, max_seq_len=1)
            got = graphed(hidden.clone(), offsets.clone(), table.clone(), lengths.clone(), max_seq_len=1)
            assert torch.equal(got, want), step
            outs.append(got)
            copies.append(got.clone())
    graphs = graphed._decode_graphs
    assert (graphs.captures, graphs.replays) == (1, 5)
    assert torch.equal(graphed.latent_cache, eager.latent_cache)
    for out, copy in zip(outs, copies):
        assert torch.equal(out, copy)


def test_every_input_is_copied_in():
    """A replay sees the caller's hidden states, offsets, table and lengths of this call, not the capture's."""
    config, eager, graphed = _modules()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for starts in ([3, 40], [4, 41]):                       # eager, then capture
            args = _inputs(config, starts, gen)
            eager(*args, max_seq_len=1)
            graphed(*args, max_seq_len=1)
        hidden, offsets, table, lengths = _inputs(config, [5, 42], gen)
        for changed in (dict(), dict(table=table.roll(1, 0)), dict(lengths=lengths + 7),
                        dict(offsets=torch.tensor([0, 0, 2]))):      # request 0 gets both tokens
            args = dict(hidden_states=hidden, input_row_offsets=offsets, block_table=table, cache_lengths=lengths)
            args.update({dict(table="block_table", lengths="cache_lengths", offsets="input_row_offsets")[k]: v
                         for k, v in changed.items()})
            if "offsets" in changed:
                with pytest.raises(MLAInputError, match="max_seq_len"):     # the checks see the new offsets
                    graphed(**args, max_seq_len=1)
                continue
            want = eager(**args, max_seq_len=1)
            assert torch.equal(graphed(**args, max_seq_len=1), want), changed
    assert graphed._decode_graphs.replays == 4


@pytest.mark.parametrize("mode", ["full", "metadata"])
def test_bad_input_raises_before_anything_is_copied_or_replayed(mode, monkeypatch):
    """Full checks: bad values raise MLAInputError with the cache, the static inputs and the replay count as
    they were; metadata checks: a strided table (the key's shape and dtype) raises the same way."""
    monkeypatch.setenv("MLA_CORE_CHECKS", mode)
    config, _, graphed = _modules()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for step in range(3):
            graphed(*_inputs(config, [10 + step, 50 + step], gen), max_seq_len=1)
        graphs = graphed._decode_graphs
        (entry,) = [e for e in graphs.entries.values() if e is not None]
        before = [t.clone() for t in entry.inputs] + [graphed.latent_cache.clone()]
        replays = graphs.replays
        hidden, offsets, table, lengths = _inputs(config, [13, 53], gen)
        bad = [dict(block_table=table.clone().fill_(99)), dict(cache_lengths=lengths - 20),
               dict(input_row_offsets=torch.tensor([0, 1, 3]))] if mode == "full" else \
            [dict(block_table=table.t().contiguous().t())]       # the key's shape, rows strided: refused
        for change in bad:
            args = dict(hidden_states=hidden, input_row_offsets=offsets, block_table=table, cache_lengths=lengths)
            args.update(change)
            with pytest.raises(MLAInputError):
                graphed(**args, max_seq_len=1)
        assert graphs.replays == replays
        for a, b in zip([t for t in entry.inputs] + [graphed.latent_cache], before):
            assert torch.equal(a, b)


def test_recapture_after_reset_cache_and_reload():
    """A new cache or reloaded weights (same tensors, new version) drop the graphs: eager once, then a capture."""
    config, _, graphed = _modules()
    gen = torch.Generator().manual_seed(3)
    graphs = graphed._decode_graphs

    def steps(n):
        with torch.no_grad():
            for i in range(n):
                graphed(*_inputs(config, [7 + i], gen), max_seq_len=1)

    steps(3)
    assert (graphs.captures, graphs.replays) == (1, 2)
    graphed.reset_cache(48, PAGE)
    graphed.latent_cache.normal_()
    steps(1)
    assert (graphs.captures, graphs.replays) == (1, 2)             # eager: a new key
    steps(2)
    assert (graphs.captures, graphs.replays) == (2, 4)
    graphed.load_state_dict(hf_attention(config, seed=6).state_dict())
    steps(1)
    assert (graphs.captures, graphs.replays) == (2, 4)
    steps(1)
    assert graphs.captures == 3


def test_keys_and_their_bound():
    """Batch sizes are keys; at most max_decode_graphs are kept, the least recently used evicted."""
    config, _, graphed = _modules(max_graphs=2)
    gen = torch.Generator().manual_seed(4)
    graphs = graphed._decode_graphs
    with torch.no_grad():
        for batch in (1, 2, 1, 2, 3, 1):
            graphed(*_inputs(config, [9] * batch, gen), max_seq_len=1)
    assert len(graphs.entries) == 2
    assert [k[0][0][0] for k in graphs.entries] == [3, 1]          # hidden's token count leads each key
    assert graphs.captures == 2                                    # batch 1 and 2; 3 and the evicted 1 ran eagerly


def test_fallbacks_run_eagerly(monkeypatch):
    """No key (eager) for prefill, max_seq_len None, grad enabled, tensor parallelism, an outer capture, a CPU
    tensor; sparse indices never reach the graphs."""
    config, eager, graphed = _modules()
    graphs = graphed._decode_graphs
    hidden, offsets, table, lengths = _inputs(config, [30, 31], torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert graphs.key(graphed, hidden, offsets, table, lengths, 1) is not None
        assert graphs.key(graphed, hidden, offsets, table, lengths, 2) is None
        assert graphs.key(graphed, hidden, offsets, table, lengths, None) is None
        assert graphs.key(graphed, hidden, offsets, table, lengths, True) is None
        assert graphs.key(graphed, hidden[:1], offsets, table, lengths, 1) is None      # not one token a request
        assert graphs.key(graphed, hidden, offsets, table, lengths, 1) is not None
        monkeypatch.setattr(graphed, "tp_group", object())
        assert graphs.key(graphed, hidden, offsets, table, lengths, 1) is None
        monkeypatch.setattr(graphed, "tp_group", None)
        monkeypatch.setattr(FakeGraphs, "_outer_capture", staticmethod(lambda t: True))
        assert graphs.key(graphed, hidden, offsets, table, lengths, 1) is None
        assert DecodeGraphs().key(graphed, hidden, offsets, table, lengths, 1) is None  # a CPU tensor
        monkeypatch.setattr(FakeGraphs, "_outer_capture", staticmethod(lambda t: False))
        assert graphs.key(graphed, hidden, offsets, table, lengths, 1) is not None
    assert graphs.key(graphed, hidden, offsets, table, lengths, 1) is None              # grad enabled
    monkeypatch.setattr(FakeGraphs, "key", lambda *a: pytest.fail("sparse call reached the graphs"))
    rows = graphed.latent_cache.shape[0] * PAGE
    with torch.no_grad():
        graphed(hidden, offsets, table, lengths, max_seq_len=1,
                sparse_indices=torch.randint(0, rows, (2, 8), generator=torch.Generator().manual_seed(6)))


def test_constructor_arguments():
    config = small_config()
    assert "_decode_graphs" not in MLAAttention(config).__dict__
    assert MLAAttention(config, cuda_graph_decode=True, max_decode_graphs=3)._decode_graphs.max_graphs == 3
    for bad in (dict(cuda_graph_decode=1), dict(cuda_graph_decode=True, max_decode_graphs=0),
                dict(cuda_graph_decode=True, max_decode_graphs=True)):
        with pytest.raises(ValueError):
            MLAAttention(config, **bad)
