"""examples/deepseek_tiny: a DeepSeek-V3-shaped model on mla_core.nn.MLAAttention generates what transformers does."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from reference_math import rel_l2

pytest.importorskip("transformers")
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "deepseek_tiny")
sys.path.insert(0, EXAMPLE)
from tiny_deepseek import TinyDeepseek, random_hf_model, tiny_config  # noqa: E402

from mla_core.nn import StaticPageTable  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny ops: one intra-op thread avoids oversubscribing a shared CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_greedy_generation_matches_transformers():
    """Every step's logits equal transformers' (the whole model: dense + MoE layers, YaRN, paged cache)."""
    config = tiny_config(layers=2)
    hf = random_hf_model(config, seed=1)
    prompts = [[5, 17, 99], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    steps = 6
    gen = torch.Generator().manual_seed(2)
    table = StaticPageTable(len(prompts), 11 + steps, 4, generator=gen)
    model = TinyDeepseek(hf, table.num_pages, 4, attention_backend="reference")
    tokens, step_logits = model.generate(prompts, steps, table)
    assert [len(t) for t in tokens] == [steps] * 3
    assert table.lengths.tolist() == [len(p) + steps - 1 for p in prompts]
    for b, prompt in enumerate(prompts):
        history = torch.tensor([prompt + tokens[b][:-1]])
        with torch.no_grad():
            expected = hf(history).logits[0, len(prompt) - 1:]            # [steps, vocab]
        mine = torch.stack([lg[b] for lg in step_logits])
        assert rel_l2(mine, expected) < 1e-5
        assert tokens[b] == expected.argmax(-1).tolist()


def test_example_script_runs():
    script = os.path.join(EXAMPLE, "generate.py")
    result = subprocess.run([sys.executable, script, "--steps", "3", "--batch", "2", "--layers", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "6 tokens in" in result.stdout and "tokens/s" in result.stdout


@pytest.mark.gpu
def test_cuda_graph_decode_matches_eager():
    """Dense layers on the GPU: replaying one captured decode step generates what eager steps do."""
    config = tiny_config(layers=2, first_k_dense_replace=2)
    hf = random_hf_model(config, seed=3, dtype=torch.bfloat16).cuda()
    prompts = [[5, 17, 99], [7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    runs = []
    for graph in (False, True):
        table = StaticPageTable(len(prompts), 11 + 8, 16, device="cuda", generator=torch.Generator().manual_seed(4))
        model = TinyDeepseek(hf, table.num_pages, 16)
        runs.append(model.generate(prompts, 8, table, cuda_graph=graph))
        assert table.lengths.tolist() == [len(p) + 7 for p in prompts]
    assert runs[0][0] == runs[1][0]
    assert rel_l2(torch.stack(runs[1][1]), torch.stack(runs[0][1])) < 1e-3
