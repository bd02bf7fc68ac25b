"""With PDL, a large grid takes blocks that each move at least 8 KiB of state (a PDL launch pays
some 1.2 ns a block on the H100, where a plain launch hides it): the launch shapes of
fla-recurrent and cuda-v4 under PDL, checked on the shapes alone (no GPU needed)."""
import pytest
import torch

from gdnzoo.backends import _pdl_launch as pdl, cuda_v4, fla_recurrent


@pytest.mark.parametrize("sd", ["fp32", "bf16"])
def test_fla_recurrent_pdl_programs_stay_large(sd):
    size = 4 if sd == "fp32" else 2
    for B in (1, 4, 16, 64, 128, 256, 512, 1024):
        for bv in (1, 2, 4, 8, 16, 32, 64, 128):
            row = (bv, 1, 1, None, 0)
            got = fla_recurrent.pdl_config(sd, B * 8, 128, 128, row)
            programs = B * 8 * (128 // bv)
            if programs <= pdl.MANY_BLOCKS or 2 * bv * 128 * size >= 8192:
                assert got[:3] == row[:3], (B, bv, got)
            else:
                assert got[0] > bv and (2 * got[0] * 128 * size >= 8192
                                        or B * 8 * (128 // got[0]) <= pdl.MANY_BLOCKS)
                assert got[0] * 128 <= 64 * 32 * got[1]       # registers: <= 64 elements a thread


@pytest.mark.parametrize("sd", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_v4_pdl_blocks_stay_large(sd):
    size = 4 if sd == torch.float32 else 2
    for B in (1, 4, 16, 64, 128, 256, 512, 1024):
        for w, rw, lpr in ((1, 1, 16), (1, 2, 32), (2, 2, 16), (4, 2, 16), (1, 8, 8), (8, 4, 16)):
            if cuda_v4.valid_config(128, 128, sd, w, rw, lpr):
                continue                                        # not a row of this dtype
            got = cuda_v4.pdl_warps(sd, B * 8, 128, 128, w, rw, lpr)
            rows = lambda w: w * rw * (32 // lpr)             # noqa: E731
            blocks = B * 8 * cuda_v4.blocks_per_head(128, w, rw, lpr)
            if blocks <= pdl.MANY_BLOCKS or 2 * rows(w) * 128 * size >= 8192:
                assert got == w, (B, w, rw, lpr, got)
            else:
                assert got > w and not cuda_v4.valid_config(128, 128, sd, got, rw, lpr)
                assert (2 * rows(got) * 128 * size >= 8192 or got == cuda_v4.MAX_WARPS
                        or B * 8 * cuda_v4.blocks_per_head(128, got, rw, lpr)
                        <= pdl.MANY_BLOCKS or rows(2 * got) > 128)
