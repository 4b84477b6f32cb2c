"""mla_core.layouts: pack / unpack between float latent rows and both FP8 cache-row layouts, both ways."""
import pytest
import torch

from mla_core import layouts, numerics

FP8 = torch.float8_e4m3fn


def rows(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 576, generator=g)
    x[:, :512] *= torch.tensor([1e-3, 1.0, 30.0, 1e3]).repeat_interleave(128)  # each block its own range
    return x


def test_ds_mla_pack_then_unpack_is_the_blockwise_qdq():
    x = rows()
    packed = layouts.pack_fp8_ds_mla(x)
    assert packed.dtype == torch.uint8 and packed.shape == (6, 656)
    # independent float64 expectation: scale = amax / 448 per 128-block, code = e4m3(x / scale)
    want = torch.empty(6, 576, dtype=torch.float64)
    for r in range(6):
        for j in range(4):
            blk = x[r, 128 * j:128 * (j + 1)]
            scale = torch.tensor(float(blk.abs().max()) / 448.0, dtype=torch.float32)
            assert float(layouts.ds_mla_scales(packed)[r, j]) == float(scale)
            want[r, 128 * j:128 * (j + 1)] = (numerics.round_e4m3(blk / scale) * scale).double()  # float32 product
        want[r, 512:] = x[r, 512:].to(torch.bfloat16).double()
    got = layouts.unpack_fp8_ds_mla(packed)
    assert got.dtype == torch.float32 and torch.equal(got.double(), want)
    assert float((got - x).norm() / x.norm()) > 1e-3  # quantized, not a copy
    assert torch.equal(layouts.unpack_fp8_ds_mla(packed.view(FP8)), got)  # FlashMLA types the rows as FP8


def test_ds_mla_unpack_then_pack_restores_rows_whose_blocks_reach_448():
    g = torch.Generator().manual_seed(1)
    codes = (torch.rand(4, 512, generator=g) * 800 - 400).to(FP8)
    codes[:, 0::128] = torch.tensor(448.0).to(FP8)  # every block's largest code is 448: the scale is recovered
    scales = torch.tensor([0.5, 3.0, 1e-4, 17.25])[None, :].expand(4, 4).contiguous()
    rope = torch.randn(4, 64, generator=g).to(torch.bfloat16)
    packed = torch.cat((codes.view(torch.uint8), scales.view(torch.uint8), rope.view(torch.uint8)), dim=-1)
    assert torch.equal(layouts.pack_fp8_ds_mla(layouts.unpack_fp8_ds_mla(packed)), packed)


def test_zero_block_gets_scale_one_and_paged_shapes_work():
    x = rows(8).view(2, 4, 576)
    x[0, 0, :128] = 0
    packed = layouts.pack_fp8_ds_mla(x)
    assert packed.shape == (2, 4, 656) and float(layouts.ds_mla_scales(packed)[0, 0, 0]) == 1.0
    assert (layouts.unpack_fp8_ds_mla(packed)[0, 0, :128] == 0).all()


def test_fp8_rows_both_ways():
    x = rows(seed=2)
    packed = layouts.pack_fp8(x, quant_scale=0.01)
    assert packed.dtype == FP8 and packed.shape == x.shape
    assert torch.equal(packed.float(), numerics.round_e4m3(x * 0.01))
    back = layouts.unpack_fp8(packed, descale=100.0)
    assert torch.equal(layouts.pack_fp8(back, 0.01).view(torch.uint8), packed.view(torch.uint8))
    assert torch.equal(layouts.unpack(packed), packed.float())
    ds = layouts.pack_fp8_ds_mla(x)
    assert torch.equal(layouts.unpack(ds), layouts.unpack_fp8_ds_mla(ds))


def test_wrong_width_is_refused():
    with pytest.raises(ValueError, match="576"):
        layouts.pack_fp8_ds_mla(torch.zeros(2, 512))
    with pytest.raises(ValueError, match="656"):
        layouts.unpack_fp8_ds_mla(torch.zeros(2, 576, dtype=torch.uint8))
