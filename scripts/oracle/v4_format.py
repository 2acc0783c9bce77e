"""Release on-disk formats of DeepSeek-V4-Flash checkpoints, numpy only (spec model-v4.md §2.3).

An independent implementation: BF16 rounding, FP8 e4m3fn weights with F8_E8M0 128x128 block
scales, FP4 e2m1 experts packed two per byte (low nibble = even element) with F8_E8M0 per-32
scales, and a minimal safetensors writer/reader (raw bytes, so F8_E8M0 needs no library support).
`python3 v4_format.py --selfcheck` checks every codec against hand-computed values.
"""
import json
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- BF16 / E8M0 / E4M3 / E2M1


def bf16_bits(x):
    """fp32 -> bf16 bit patterns (uint16), round to nearest even (no NaNs expected)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def round_bf16(x):
    return bf16_to_f32(bf16_bits(x))


def e8m0_to_f32(b):
    """E8M0 byte -> 2^(b-127) as fp32; 0xFF is NaN."""
    b = np.asarray(b, dtype=np.uint8)
    out = np.ldexp(np.float64(1.0), b.astype(np.int32) - 127).astype(np.float32)
    out[b == 0xFF] = np.nan
    return out


def _e4m3_table():
    """Value of every e4m3fn byte (index = byte). 0x7F / 0xFF are NaN (no infinities)."""
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = codes & 7
    mag = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    vals = sign * mag
    vals[(exp == 15) & (man == 7)] = np.nan
    return vals


E4M3_VALUES = _e4m3_table()
E4M3_MAX = 448.0
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                       dtype=np.float64)


def _nearest_code(x, pos_codes, pos_vals):
    """Nearest non-negative grid point for |x| (ties -> even code), sign handled by the caller.
    pos_vals must be ascending and pos_codes the matching codes."""
    a = np.abs(x)
    hi = np.clip(np.searchsorted(pos_vals, a), 1, len(pos_vals) - 1)
    lo = hi - 1
    dlo, dhi = a - pos_vals[lo], pos_vals[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (pos_codes[hi] % 2 == 0))
    return np.where(pick_hi, pos_codes[hi], pos_codes[lo])


_E4M3_POS = np.arange(0x7F)  # 0x00..0x7E: 0 .. 448 ascending
_E2M1_POS = np.arange(8)


def f32_to_e4m3(x):
    """fp32 -> e4m3fn bytes (uint8), saturating at ±448, round to nearest even."""
    x = np.clip(np.asarray(x, dtype=np.float64), -E4M3_MAX, E4M3_MAX)
    code = _nearest_code(x, _E4M3_POS, E4M3_VALUES[:0x7F])
    return (code | np.where(np.signbit(x) & (code != 0), 0x80, 0)).astype(np.uint8)


def f32_to_e2m1(x):
    """fp32 -> e2m1 nibble codes 0..15, saturating at ±6, round to nearest even."""
    x = np.clip(np.asarray(x, dtype=np.float64), -6.0, 6.0)
    code = _nearest_code(x, _E2M1_POS, E2M1_VALUES[:8])
    return (code | np.where(np.signbit(x) & (code != 0), 8, 0)).astype(np.uint8)


def pow2_scale_exp(amax, qmax):
    """Smallest power-of-two exponent e with amax / 2^e <= qmax (the e8m0 scale rule)."""
    amax = np.maximum(amax, 1e-30)
    return np.ceil(np.log2(amax / qmax)).astype(np.int32)


# ---------------------------------------------------------------- block quantisation


def quant_fp8_block(w, block=128, exp_jitter=None):
    """w [out, in] fp32 -> (e4m3 bytes [out, in], e8m0 bytes [ceil(out/b), ceil(in/b)]).
    exp_jitter (same shape as the scale grid, ints >= 0) coarsens some blocks on purpose so
    that scales differ between blocks."""
    out_f, in_f = w.shape
    gr, gc = -(-out_f // block), -(-in_f // block)
    scale_e = np.zeros((gr, gc), dtype=np.int32)
    codes = np.zeros((out_f, in_f), dtype=np.uint8)
    for i in range(gr):
        for j in range(gc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            e = int(pow2_scale_exp(np.abs(blk).max(), E4M3_MAX))
            if exp_jitter is not None:
                e += int(exp_jitter[i, j])
            scale_e[i, j] = e
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = f32_to_e4m3(
                blk.astype(np.float64) / 2.0 ** e)
    return codes, (scale_e + 127).astype(np.uint8)


def dequant_fp8_block(codes, scale, block=128):
    """W[i, j] = e4m3(codes[i, j]) * 2^(scale[i/b, j/b] - 127)."""
    out_f, in_f = codes.shape
    s = e8m0_to_f32(scale).astype(np.float64)
    s_full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[:out_f, :in_f]
    return (E4M3_VALUES[codes] * s_full).astype(np.float32)


def quant_fp4_group(w, group=32):
    """w [out, in] fp32 -> (packed int8 [out, in/2], e8m0 bytes [out, in/group]).
    Byte [i, j] = code(i, 2j) | code(i, 2j+1) << 4."""
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // group, group).astype(np.float64)
    e = pow2_scale_exp(np.abs(g).max(axis=2), 6.0)
    codes = f32_to_e2m1(g / (2.0 ** e)[:, :, None]).reshape(out_f, in_f)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8).view(np.int8)
    return packed, (e + 127).astype(np.uint8)


def dequant_fp4_group(packed, scale, group=32):
    u = packed.view(np.uint8)
    out_f = u.shape[0]
    codes = np.empty((out_f, u.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = u & 0xF
    codes[:, 1::2] = u >> 4
    s = np.repeat(e8m0_to_f32(scale).astype(np.float64), group, axis=1)
    return (E2M1_VALUES[codes] * s).astype(np.float32)


# ---------------------------------------------------------------- safetensors


_ST_DTYPES = {"BF16": (np.uint16, 2), "F32": (np.float32, 4), "F8_E4M3": (np.uint8, 1),
              "F8_E8M0": (np.uint8, 1), "I8": (np.int8, 1), "I64": (np.int64, 8)}


def write_safetensors(path, tensors):
    """tensors: list of (name, st_dtype, array) with array already in the storage dtype."""
    header, blobs, off = {}, [], 0
    for name, dt, arr in tensors:
        np_dt, size = _ST_DTYPES[dt]
        raw = np.ascontiguousarray(arr.astype(np_dt, copy=False)).astype(
            np.dtype(np_dt).newbyteorder("<"), copy=False).tobytes()
        assert len(raw) == int(np.prod(arr.shape, dtype=np.int64)) * size, name
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    return off


def read_safetensors(path):
    """-> {name: (st_dtype, array in storage dtype)}."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        np_dt, _ = _ST_DTYPES[meta["dtype"]]
        a, b = meta["data_offsets"]
        out[name] = (meta["dtype"], np.frombuffer(data[a:b], dtype=np_dt).reshape(meta["shape"]))
    return out


# ---------------------------------------------------------------- self-check


def selfcheck():
    import os
    import tempfile
    # e4m3: known bytes, and every finite byte survives decode -> encode.
    assert E4M3_VALUES[0x7E] == 448.0 and E4M3_VALUES[0x08] == 2.0 ** -6
    assert E4M3_VALUES[0x01] == 2.0 ** -9 and E4M3_VALUES[0x38] == 1.0 and E4M3_VALUES[0xB8] == -1.0
    assert np.isnan(E4M3_VALUES[0x7F]) and np.isnan(E4M3_VALUES[0xFF])
    finite = [c for c in range(256) if not np.isnan(E4M3_VALUES[c]) and c != 0x80]
    assert (f32_to_e4m3(E4M3_VALUES[finite]) == np.array(finite)).all()
    assert f32_to_e4m3(np.array([1000.0, -1000.0])).tolist() == [0x7E, 0xFE]
    # Ties go to the even code: 1.0625 sits between 1.0 (0x38) and 1.125 (0x39).
    assert f32_to_e4m3(np.array([1.0625, 1.1875])).tolist() == [0x38, 0x3A]
    # e2m1
    assert f32_to_e2m1(np.array([0, 0.5, 6, -6, 5.0, 2.5, 0.25, 7.0])).tolist() == [0, 1, 7, 15, 6, 4, 0, 7]
    # e8m0 and bf16
    assert e8m0_to_f32(np.array([127, 128, 120], dtype=np.uint8)).tolist() == [1.0, 2.0, 2.0 ** -7]
    assert bf16_bits(np.array([1.0, -2.0, 1.00390625], dtype=np.float32)).tolist() == [0x3F80, 0xC000, 0x3F80]
    assert bf16_bits(np.array([1.01171875], dtype=np.float32)).tolist() == [0x3F82]  # tie -> even
    rng = np.random.default_rng(0)
    # FP8 block round trip: error bounded by half an e4m3 ulp of the block's scale.
    w = rng.standard_normal((200, 300)).astype(np.float32) * 0.05
    codes, sc = quant_fp8_block(w)
    assert sc.shape == (2, 3)
    d = dequant_fp8_block(codes, sc)
    s_full = np.repeat(np.repeat(e8m0_to_f32(sc), 128, 0), 128, 1)[:200, :300]
    bound = np.maximum(np.abs(w) * 2.0 ** -4, s_full * 2.0 ** -10)  # half ulp (normal/subnormal)
    assert (np.abs(d - w) <= bound * (1 + 1e-6)).all()
    assert (f32_to_e4m3(d / s_full) == codes).all()  # dequantised values re-encode exactly
    # FP4 packing: low nibble is the even element.
    w4 = np.zeros((1, 64), dtype=np.float32)
    w4[0, 0], w4[0, 1] = 1.0, -6.0
    p, s4 = quant_fp4_group(w4)
    assert p.shape == (1, 32) and s4.shape == (1, 2) and s4[0, 0] == 127
    assert p.view(np.uint8)[0, 0] == (2 | (15 << 4)), p.view(np.uint8)[0, 0]
    w4 = rng.standard_normal((8, 96)).astype(np.float32)
    p, s4 = quant_fp4_group(w4)
    d4 = dequant_fp4_group(p, s4)
    assert np.abs(d4 - w4).max() <= (e8m0_to_f32(s4).max() * 1.0) + 1e-6
    s4_full = np.repeat(e8m0_to_f32(s4), 32, axis=1)
    c4 = f32_to_e2m1(d4 / s4_full)  # dequantised values re-encode exactly at the same scale
    assert ((c4[:, 0::2] | (c4[:, 1::2] << 4)).view(np.int8) == p).all()
    # safetensors round trip.
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "t.safetensors")
        write_safetensors(path, [("a", "F8_E4M3", codes), ("b", "F8_E8M0", sc), ("c", "I8", p),
                                 ("d", "BF16", bf16_bits(w)), ("e", "I64", np.arange(6).reshape(2, 3))])
        back = read_safetensors(path)
        assert (back["a"][1] == codes).all() and back["b"][0] == "F8_E8M0"
        assert (back["c"][1] == p).all() and (back["e"][1] == np.arange(6).reshape(2, 3)).all()
        assert (bf16_to_f32(back["d"][1]) == round_bf16(w)).all()
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
        assert (8 + n) % 8 == 0
    print("v4_format selfcheck: ok")


if __name__ == "__main__":
    if "--selfcheck" in sys.argv:
        selfcheck()
