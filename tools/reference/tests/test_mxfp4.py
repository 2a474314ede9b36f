"""MXFP4 (compressed-tensors mxfp4-pack-quantized) decoding vs transformers.integrations.mxfp4."""
import pytest
import torch

from conftest import rel_err
from k31ref import ops

mx = pytest.importorskip("transformers.integrations.mxfp4")


def _hf_decode(packed, scale):
    """Re-express the K3 [out, in/2] / [out, in/32] planes in gpt-oss [E, out, in/32, 16] layout and decode."""
    out, half = packed.shape
    blocks = packed.reshape(1, out, half // 16, 16)
    scales = scale.reshape(1, out, half // 16)
    w = mx.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    # transformers returns [E, in, out] (transposed for the gpt-oss forward)
    assert w.shape == (1, half * 2, out)
    return w[0].t()


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (3, 32)])
def test_decode_vs_transformers(shape, measure):
    out, n = shape
    g = torch.Generator().manual_seed(out * 1000 + n)
    packed = torch.randint(0, 256, (out, n // 2), generator=g, dtype=torch.int64).to(torch.uint8)
    scale = torch.randint(100, 150, (out, n // 32), generator=g, dtype=torch.int64).to(torch.uint8)
    ours = ops.mxfp4_decode(packed, scale, torch.float32)
    ref = _hf_decode(packed, scale)
    measure(f"MXFP4 decode {out}x{n} vs transformers convert_moe_packed_tensors (exact)",
            (ours - ref).abs().max().item(), 0)


def test_decode_table_all_bytes(measure):
    """Every byte value, with the scale byte 127 (multiplier 1) and 128 (x2)."""
    packed = torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(16, 16)
    for s in (127, 128, 120):
        scale = torch.full((16, 1), s, dtype=torch.uint8)
        ours = ops.mxfp4_decode(packed, scale, torch.float32)
        ref = _hf_decode(packed, scale)
        assert torch.equal(ours, ref)
        # low nibble = even column
        b = packed.reshape(-1).to(torch.int64)
        lut = torch.tensor(ops.FP4_VALUES)
        expect = torch.stack([lut[b & 15], lut[b >> 4]], -1).reshape(16, 32) * 2.0 ** (s - 127)
        assert torch.equal(ours, expect)
    measure("MXFP4 decode, all 256 bytes x 3 scales vs transformers (exact)", 0.0, 0)


def test_encode_roundtrip(measure):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 128, generator=g, dtype=torch.float64) / 128 ** 0.5
    packed, scale = ops.mxfp4_encode(w)
    deq = ops.mxfp4_decode(packed, scale, torch.float64)
    # re-encoding decoded values is the identity on the bytes
    p2, s2 = ops.mxfp4_encode(deq)
    assert torch.equal(p2, packed) and torch.equal(s2, scale)
    # quantisation error: <= 2 * 2^e (half of the 4->6 step, or the clamp of [6, 8) to 6)
    step = torch.pow(2.0, scale.to(torch.float64) - 127).repeat_interleave(32, 1)
    assert ((deq - w).abs() <= 2 * step + 1e-12).all()
    measure("MXFP4 encode->decode relative error (info)", rel_err(deq, w))
