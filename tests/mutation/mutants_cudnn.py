"""Mutants of the cudnn backend (its causal split, row flags, finishing Triton kernels, QDQ codes): each is
one plausible bug the CPU tests (cuDNN emulated in float64, kernels under the Triton interpreter) must notice.
``old`` occurs exactly once in ``file``; ``new`` replaces it.
"""

_T = "tests/test_cudnn_backend.py"

MUTANTS = [
    dict(file="backends/cudnn/mla_core_cudnn/prefill.py",
         old="        ok_b = (pos >= blind[seq]).to(torch.int8)",
         new="        ok_b = (pos > blind[seq]).to(torch.int8)",
         tests=[f"{_T}::test_ragged_lengths_match_the_reference[True-True]"],
         why="off by one at the causal square's first row: the first query that sees a key is dropped as blind"),
    dict(file="backends/cudnn/mla_core_cudnn/prefill.py",
         old="        prefix = (len_k - len_q).clamp_min(0)      # keys every query of the sequence sees",
         new="        prefix = (len_k - len_q + 1).clamp_min(0)  # keys every query of the sequence sees",
         tests=[f"{_T}::test_ragged_lengths_match_the_reference[True-True]"],
         why="off by one at the prefix edge: the square's first key becomes visible to every query"),
    dict(file="backends/cudnn/mla_core_cudnn/finish.py",
         old="        tl.store(lse_out_ptr + h64 * tokens + t, tl.where(ok != 0, lse, float(\"-inf\")), mask=mask_h)",
         new="        tl.store(lse_out_ptr + h64 * tokens + t, tl.where(ok == 0, lse, float(\"-inf\")), mask=mask_h)",
         tests=[f"{_T}::test_ragged_lengths_match_the_reference[True-False]"],  # ids: [return_lse-causal]
         why="wrong mask: rows with keys get LSE -inf and rows without keep cuDNN's leftovers"),
    dict(file="backends/cudnn/mla_core_cudnn/finish.py",
         old="    wb = tl.where(has, eb / total, 0.0)",
         new="    wb = tl.where(has, ea / total, 0.0)",
         tests=[f"{_T}::test_ragged_lengths_match_the_reference[False-True]"],
         why="wrong merge weight: the causal square is weighted by the prefix's share"),
    dict(file="backends/cudnn/mla_core_cudnn/prefill.py",
         old="    scale = _float32(call.softmax_scale) * q_factor * k_factor",
         new="    scale = _float32(call.softmax_scale) * q_factor",
         tests=[f"{_T} -k 'qkv_quantization and 3.7-fp8'"],
         why="wrong scale: K's per-tensor factor is taken out of the codes and never folded back"),
    dict(file="backends/cudnn/mla_core_cudnn/prefill.py",
         old="    dest = (first_block[seq] * numerics.NVFP4_BLOCK + rows - cu[seq]).clamp(0, capacity - 1)",
         new="    dest = (first_block[seq] * numerics.NVFP4_BLOCK + rows).clamp(0, capacity - 1)",
         tests=[f"{_T} -k bitwise"],
         why="wrong index: V's NVFP4 blocks no longer start at each sequence's first key"),
    dict(file="backends/cudnn/mla_core_cudnn/prefill.py",
         old="    return a.shape[0] == 2 and call.q.shape[0] == call.k.shape[0]",
         new="    return a.shape[0] == 2",
         tests=[f"{_T} -k one_sequence"],
         why="one sequence with len_q < len_k taken as square: top-left causal hides the cached prefix's tail"),
    dict(file="backends/cudnn/mla_core_cudnn/prefill.py",
         old="    seq = torch.searchsorted(cu[1:].contiguous(), rows, right=True).clamp_max(cu.shape[0] - 2)\n    return seq",
         new="    seq = torch.searchsorted(cu[1:].contiguous(), rows, right=False).clamp_max(cu.shape[0] - 2)\n    return seq",
         tests=[f"{_T}::test_ragged_lengths_match_the_reference[True-True]"],
         why="wrong index: a sequence's last row is attributed to the next sequence (row flags from the wrong lengths)"),
    dict(file="backends/cudnn/mla_core_cudnn/backend.py",
         old='        if problem.get("p_quant") is not None:',
         new='        if False:',
         tests=[f"{_T} -k why_not_explains"],
         why="P quantization must be refused: cuDNN cannot quantize P inside the kernel"),
]
