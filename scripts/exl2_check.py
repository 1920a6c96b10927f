#!/usr/bin/env python3
"""Independent EXL2 / GPTQ model checker (numpy only), written from docs/EXL2.md, not from tessera's C code.

Usage: exl2_check.py MODEL_DIR [--expect-bpw B] [--tolerance 0.05] [--no-dequant] [--quiet]
       exl2_check.py --selftest

Reads config.json and every *.safetensors file of MODEL_DIR (EXL2.md §1.1 loader rule: no index), checks the
tensor inventory of a Llama/Mistral/Qwen2 model (§9.1), and for every EXL2 linear layer (§3) checks shapes,
q_groups (§4.1: known widths, non-increasing, whole words, rows summing to K, first packed row 0, increasing),
q_invperm (a permutation of 0..K-1, §4.3), then dequantizes every group (§5.1 column bit streams, §6 fp16 scale
evaluation) and checks the values are finite, not all zero, and that padded columns (§5.2) hold code 2^(b-1).
Reports the average bits per weight of the decoder layers (stored q_weight + q_scale + q_scale_max + q_groups +
q_invperm bits over K*N) and, with --expect-bpw, fails when it is off by more than --tolerance.
GPTQ models (quantization_config.quant_method "gptq", or a quantize_config.json) are checked per §8 instead:
qweight [K/8, N], qzeros [G, N/8], scales [G, N], g_idx [K] (range, at most group_size rows per group; all zeros
or absent means k / group_size), every layer dequantized as (q - (zero code + 1)) * scale (v1) or
(q - zero code) * scale (checkpoint_format gptq_v2); lm_head may be fp16 (lm_head.weight) or GPTQ. The bits per
weight count qweight + qzeros + scales + g_idx. --expect-bpw applies to both formats.
--selftest decodes the §5.1 test vectors. Exit status: 0 valid, 1 invalid, 2 usage.
"""
import glob
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F32": np.dtype("<f4"), "I32": np.dtype("<i4"),
          "I16": np.dtype("<i2"), "I64": np.dtype("<i8"), "U8": np.dtype("u1"), "I8": np.dtype("i1")}
WIDTHS = (2, 3, 4, 5, 6, 8)

# EXL2.md §5.1 test vectors: one column, 32 rows, codes (7j+3) mod 2^b
VECTORS = {
    2: "1B1B1B1B 1B1B1B1B",
    3: "53977053 70539770 97705397",
    4: "4D6F81A3 C5E7092B 4D6F81A3 C5E7092B",
    5: "4DFC4543 78245BA3 0753617D 4B276CF4 E55C7066",
    6: "9F611283 90BBD2D9 B2579740 8F201EB3 9CAB91D5 71538703",
    8: "18110A03 342D261F 5049423B 6C655E57 88817A73 A49D968F C0B9B2AB DCD5CEC7",
}


class Invalid(Exception):
    pass


def unpack_group(words, bits):
    """words: uint32 [qrows, N] of one group; returns codes [rows, N] (stream bit s = bit s%32 of word s//32)."""
    qr = words.shape[0]
    rows = qr * 32 // bits
    w64 = words.astype(np.uint64)
    s = np.arange(rows, dtype=np.int64) * bits
    wi = s >> 5
    sh = (s & 31).astype(np.uint64)
    lo = w64[wi]
    hi = w64[np.minimum(wi + 1, qr - 1)]
    v = (lo | (hi << np.uint64(32))) >> sh[:, None]
    return (v & np.uint64((1 << bits) - 1)).astype(np.int32)


def selftest():
    for b, text in VECTORS.items():
        words = np.array([int(x, 16) for x in text.split()], dtype=np.uint32).reshape(-1, 1)
        codes = unpack_group(words, b)[:, 0]
        want = (7 * np.arange(32) + 3) % (1 << b)
        if codes.shape[0] != 32 or not np.array_equal(codes, want):
            print(f"selftest: {b}-bit vector decodes to {codes.tolist()}")
            return 1
    print("selftest: EXL2.md §5.1 vectors decode correctly")
    return 0


class Model:
    def __init__(self, d):
        self.dir = d
        files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
        if not files:
            raise Invalid(f"{d}: no *.safetensors files")
        self.tensors = {}
        self.file_bytes = 0
        for f in files:
            size = os.path.getsize(f)
            self.file_bytes += size
            with open(f, "rb") as fp:
                (hlen,) = struct.unpack("<Q", fp.read(8))
                if hlen > size - 8:
                    raise Invalid(f"{f}: header length {hlen} beyond the file")
                header = json.loads(fp.read(hlen))
            data_start = 8 + hlen
            mm = np.memmap(f, dtype=np.uint8, mode="r")
            spans = []
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                if name in self.tensors:
                    raise Invalid(f"{f}: tensor '{name}' also in {self.tensors[name][0]}")
                dt = DTYPES.get(info["dtype"])
                if dt is None:
                    raise Invalid(f"{f}: tensor '{name}': unsupported dtype {info['dtype']}")
                shape = tuple(int(x) for x in info["shape"])
                b, e = (int(x) for x in info["data_offsets"])
                if e - b != int(np.prod(shape, dtype=np.int64)) * dt.itemsize or data_start + e > size or b < 0:
                    raise Invalid(f"{f}: tensor '{name}': offsets [{b}, {e}) do not match {info['dtype']}{list(shape)}")
                if (data_start + b) % dt.itemsize:
                    raise Invalid(f"{f}: tensor '{name}' is not aligned to its element size")
                spans.append((b, e, name))
                arr = mm[data_start + b:data_start + e].view(dt).reshape(shape)
                self.tensors[name] = (f, info["dtype"], arr)
            spans.sort()
            for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
                if b1 < e0:
                    raise Invalid(f"{f}: tensors '{n0}' and '{n1}' overlap")

    def get(self, name, dtype=None, shape=None):
        if name not in self.tensors:
            raise Invalid(f"tensor '{name}' is missing")
        f, dt, arr = self.tensors[name]
        if dtype and dt != dtype:
            raise Invalid(f"{f}: tensor '{name}' is {dt}, expected {dtype}")
        if shape is not None and (len(shape) != arr.ndim
                                  or any(s is not None and s != a for s, a in zip(shape, arr.shape))):
            raise Invalid(f"{f}: tensor '{name}' has shape {list(arr.shape)}, expected {list(shape)}")
        return arr


def check_linear(m, key, K, N, need_bias, dequant):
    """Returns (stored bits without bias, K*Npad, stats) of EXL2 layer `key`."""
    Np = (N + 31) // 32 * 32
    qw = m.get(key + ".q_weight", "I32", (None, Np)).view(np.uint32)
    qg = m.get(key + ".q_groups", "I16")
    if qg.ndim != 1 or qg.shape[0] < 2 or qg.shape[0] % 2:
        raise Invalid(f"'{key}.q_groups' must have a positive even length")
    G = qg.shape[0] // 2
    qs = m.get(key + ".q_scale", "I32", (G, Np // 8)).view(np.uint32)
    qsm = m.get(key + ".q_scale_max", "F16", (G,))
    inv = m.get(key + ".q_invperm", "I32", (K,))
    bias = None
    if key + ".bias" in m.tensors:
        bias = m.get(key + ".bias", "F16", (Np,))
    elif need_bias:
        raise Invalid(f"tensor '{key}.bias' is missing")
    Q = qw.shape[0]
    if not np.array_equal(np.sort(inv), np.arange(K)):
        raise Invalid(f"'{key}.q_invperm' is not a permutation of 0..{K - 1}")
    groups = qg.astype(np.int64).reshape(G, 2)
    groups[:, 1] &= 0xFFFF
    if groups[0, 1] != 0:
        raise Invalid(f"'{key}.q_groups': first group starts at packed row {groups[0, 1]}")
    rows_total, prev = 0, 8
    layout = []
    for g in range(G):
        b, q0 = int(groups[g, 0]), int(groups[g, 1])
        q1 = int(groups[g + 1, 1]) if g + 1 < G else Q
        if b not in WIDTHS:
            raise Invalid(f"'{key}.q_groups': group {g} has width {b}")
        if b > prev:
            raise Invalid(f"'{key}.q_groups': widths increase at group {g} ({prev} -> {b})")
        prev = b
        if q1 <= q0 or q1 > Q:
            raise Invalid(f"'{key}.q_groups': group {g} spans packed rows [{q0}, {q1}) outside [0, {Q})")
        if (q1 - q0) * 32 % b:
            raise Invalid(f"'{key}.q_groups': group {g} is not a whole number of {b}-bit values")
        layout.append((b, q0, q1))
        rows_total += (q1 - q0) * 32 // b
    if rows_total != K:
        raise Invalid(f"'{key}.q_groups': groups cover {rows_total} rows, K = {K}")
    bits = (qw.size + qs.size + inv.size) * 32 + qsm.size * 16 + qg.size * 16
    stats = None
    if dequant:
        n_sh = (np.arange(Np) % 8 * 4).astype(np.uint32)
        ssum, ssq, cnt, nonzero = 0.0, 0.0, 0, 0
        for g, (b, q0, q1) in enumerate(layout):
            codes = unpack_group(np.asarray(qw[q0:q1]), b)
            off = 1 << (b - 1)
            if Np > N and not np.all(codes[:, N:] == off):
                raise Invalid(f"'{key}': padded columns of group {g} are not code {off} (value 0)")
            sc = ((np.asarray(qs[g])[np.arange(Np) // 8] >> n_sh) & 15).astype(np.float32)
            mult = np.float16(np.float32(qsm[g]) / np.float32(256.0)).astype(np.float32)  # h(q_scale_max/256)
            S = ((sc + 1) * (sc + 1) * mult).astype(np.float16).astype(np.float32)  # h((code+1)^2 * m)
            W = (codes[:, :N] - off).astype(np.float32) * S[None, :N]
            if not np.all(np.isfinite(W)):
                raise Invalid(f"'{key}': group {g} dequantizes to non-finite values")
            ssum += float(W.sum(dtype=np.float64))
            ssq += float((W.astype(np.float64) ** 2).sum())
            cnt += W.size
            nonzero += int(np.count_nonzero(W))
        if nonzero == 0:
            raise Invalid(f"'{key}' dequantizes to all zeros")
        mean = ssum / cnt
        stats = (mean, (ssq / cnt - mean * mean) ** 0.5)
    if bias is not None and not np.all(np.isfinite(bias.astype(np.float32))):
        raise Invalid(f"'{key}.bias' is not finite")
    return bits, K * Np, stats, G


def check_gptq_linear(m, key, K, N, need_bias, dequant, qc):
    """Returns (stored bits without bias, K*N, stats, G, act_order) of GPTQ layer `key` (EXL2.md §8)."""
    if K % 8 or N % 8:
        raise Invalid(f"'{key}': a {K} x {N} GPTQ layer needs K and N multiples of 8")
    qw = m.get(key + ".qweight", "I32", (K // 8, N)).view(np.uint32)
    if key + ".scales" not in m.tensors:
        raise Invalid(f"tensor '{key}.scales' is missing")
    sdt = m.tensors[key + ".scales"][1]
    if sdt not in ("F16", "F32"):
        raise Invalid(f"'{key}.scales' is {sdt}, expected F16 or F32")
    sc = m.get(key + ".scales", sdt, (None, N))
    G = sc.shape[0]
    if G < 1 or G > K:
        raise Invalid(f"'{key}.scales' has {G} groups for {K} rows")
    qz = m.get(key + ".qzeros", "I32", (G, N // 8)).view(np.uint32)
    gidx = m.get(key + ".g_idx", "I32", (K,)) if key + ".g_idx" in m.tensors else None
    bias = None
    if key + ".bias" in m.tensors:
        bias = m.get(key + ".bias", "F16", (N,))
    elif need_bias:
        raise Invalid(f"tensor '{key}.bias' is missing")
    gs = qc.get("group_size")
    if gs == -1:
        gs = K
    if not gs:
        gs = 1
        while gs * G < K:
            gs *= 2
    act = gidx is not None and bool(np.any(gidx != 0))
    if act:
        if gidx.min() < 0 or gidx.max() >= G:
            raise Invalid(f"'{key}.g_idx' has entries outside [0, {G})")
        counts = np.bincount(np.asarray(gidx), minlength=G)
        if counts.max() > gs:
            g = int(counts.argmax())
            raise Invalid(f"'{key}.g_idx': group {g} holds {int(counts[g])} rows, more than the group size {gs}")
        grp = np.asarray(gidx).astype(np.int64)
        act = bool(np.any(np.diff(grp) < 0))
    else:
        if (K + gs - 1) // gs != G:
            raise Invalid(f"'{key}': {G} groups, but {K} rows in groups of {gs} make {(K + gs - 1) // gs}")
        grp = np.arange(K) // gs
    zero_add = 0 if qc.get("checkpoint_format") == "gptq_v2" else 1
    bits = (qw.size + qz.size + (gidx.size if gidx is not None else 0)) * 32 + sc.size * sc.dtype.itemsize * 8
    stats = None
    if dequant:
        n_sh = (np.arange(N) % 8 * 4).astype(np.uint32)
        zeros = ((np.asarray(qz)[:, np.arange(N) // 8] >> n_sh) & 15).astype(np.int32) + zero_add  # [G, N]
        scales = np.asarray(sc).astype(np.float16).astype(np.float32)  # F32 scales are used as fp16
        ssum, ssq, cnt, nonzero = 0.0, 0.0, 0, 0
        for k0 in range(0, K, 1024):
            k = np.arange(k0, min(K, k0 + 1024))
            codes = ((np.asarray(qw)[k // 8] >> (4 * (k % 8)).astype(np.uint32)[:, None]) & 15).astype(np.int32)
            g = grp[k]
            W = (codes - zeros[g]).astype(np.float32) * scales[g]
            if not np.all(np.isfinite(W)):
                raise Invalid(f"'{key}': rows {k0}.. dequantize to non-finite values")
            ssum += float(W.sum(dtype=np.float64))
            ssq += float((W.astype(np.float64) ** 2).sum())
            cnt += W.size
            nonzero += int(np.count_nonzero(W))
        if nonzero == 0:
            raise Invalid(f"'{key}' dequantizes to all zeros")
        mean = ssum / cnt
        stats = (mean, (ssq / cnt - mean * mean) ** 0.5)
    if bias is not None and not np.all(np.isfinite(bias.astype(np.float32))):
        raise Invalid(f"'{key}.bias' is not finite")
    return bits, K * N, stats, G, act


def main(argv):
    args = argv[1:]
    if args == ["--selftest"]:
        return selftest()
    if not args or args[0].startswith("-"):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    d = args[0]
    expect, tol, dequant, quiet = None, 0.05, True, False
    i = 1
    while i < len(args):
        if args[i] == "--expect-bpw":
            expect = float(args[i + 1]); i += 2
        elif args[i] == "--tolerance":
            tol = float(args[i + 1]); i += 2
        elif args[i] == "--no-dequant":
            dequant = False; i += 1
        elif args[i] == "--quiet":
            quiet = True; i += 1
        else:
            print(f"exl2_check: unknown option {args[i]}", file=sys.stderr)
            return 2
    try:
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
        arch = cfg["architectures"][0]
        H, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
        NH = cfg["num_attention_heads"]
        NKV = cfg.get("num_key_value_heads", NH)
        D = cfg.get("head_dim") or H // NH
        I = cfg["intermediate_size"]
        qkv_bias = arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias"))
        qc = cfg.get("quantization_config") or {}
        if not qc and os.path.exists(os.path.join(d, "quantize_config.json")):
            with open(os.path.join(d, "quantize_config.json")) as f:
                qc = dict(json.load(f))
            qc.setdefault("quant_method", "gptq")
        gptq = qc.get("quant_method") == "gptq"
        if gptq and qc.get("bits") != 4:
            raise Invalid(f"GPTQ with bits = {qc.get('bits')}: only 4-bit GPTQ is defined (EXL2.md §8)")
        suffixes = ("qweight", "qzeros", "scales", "g_idx", "bias") if gptq else \
            ("q_weight", "q_groups", "q_scale", "q_scale_max", "q_invperm", "bias")
        m = Model(d)
        used = set()

        def take(name, dtype, shape):
            used.add(name)
            return m.get(name, dtype, shape)

        emb = take("model.embed_tokens.weight", "F16", (V, H))
        take("model.norm.weight", "F16", (H,))
        layer_bits, layer_numel, n_mat, n_act = 0, 0, 0, 0
        stds = []
        for layer in range(L):
            for n in ("input_layernorm", "post_attention_layernorm"):
                w = take(f"model.layers.{layer}.{n}.weight", "F16", (H,))
                if not np.all(np.isfinite(w.astype(np.float32))):
                    raise Invalid(f"model.layers.{layer}.{n}.weight is not finite")
            for name, K, N, bias in (("self_attn.q_proj", H, NH * D, qkv_bias),
                                     ("self_attn.k_proj", H, NKV * D, qkv_bias),
                                     ("self_attn.v_proj", H, NKV * D, qkv_bias), ("self_attn.o_proj", NH * D, H, False),
                                     ("mlp.gate_proj", H, I, False), ("mlp.up_proj", H, I, False),
                                     ("mlp.down_proj", I, H, False)):
                key = f"model.layers.{layer}.{name}"
                if gptq:
                    bits, numel, stats, _, act = check_gptq_linear(m, key, K, N, bias, dequant, qc)
                    n_act += act
                else:
                    bits, numel, stats, _ = check_linear(m, key, K, N, bias, dequant)
                for s in suffixes:
                    used.add(f"{key}.{s}")
                layer_bits += bits
                layer_numel += numel
                n_mat += 1
                if stats:
                    stds.append(stats[1] * K ** 0.5)
        if gptq and "lm_head.weight" in m.tensors:  # GPTQ keeps the head in fp16 as a rule
            hw = take("lm_head.weight", "F16", (V, H)).astype(np.float32)
            if not np.all(np.isfinite(hw)):
                raise Invalid("lm_head.weight is not finite")
            hb, hn, hstats, hG = 16 * V * H, V * H, (float(hw.mean()), float(hw.std())), 0
        elif gptq and "lm_head.qweight" not in m.tensors and cfg.get("tie_word_embeddings"):  # head = embedding
            hb, hn, hstats, hG = 16 * V * H, V * H, None, 0
        elif gptq:
            hb, hn, hstats, hG, _ = check_gptq_linear(m, "lm_head", H, V, False, dequant, qc)
        else:
            hb, hn, hstats, hG = check_linear(m, "lm_head", H, V, False, dequant)
        for s in suffixes:
            used.add(f"lm_head.{s}")
        extra = sorted(set(m.tensors) - used)
        if extra:
            raise Invalid(f"unexpected tensors: {extra[:5]}{' ...' if len(extra) > 5 else ''}")
        if not np.all(np.isfinite(emb[: min(V, 4096)].astype(np.float32))):
            raise Invalid("model.embed_tokens.weight is not finite")
        bpw = layer_bits / layer_numel
        if not quiet:
            fmt = "GPTQ" if gptq else "EXL2"
            print(f"{d}: {arch}, {L} layers, {n_mat} {fmt} matrices + lm_head, {len(m.tensors)} tensors, "
                  f"{m.file_bytes / 1e6:.1f} MB in {len(glob.glob(os.path.join(d, '*.safetensors')))} file(s)")
            if gptq:
                print(f"decoder layers: {bpw:.4f} bpw (GPTQ 4-bit, group_size {qc.get('group_size')}, "
                      f"desc_act {qc.get('desc_act')}, sym {qc.get('sym')}, "
                      f"{qc.get('checkpoint_format', 'gptq')}; {n_act} act-order matrices); "
                      f"lm_head: {hb / hn:.4f} bpw, {hG} groups")
            else:
                print(f"decoder layers: {bpw:.4f} bpw (quantization_config.bits = {qc.get('bits')}); "
                      f"lm_head: {hb / hn:.4f} bpw, {hG} groups")
            if stds:
                hs = f"{hstats[1]:.5f}" if hstats else "n/a"
                print(f"dequantized std*sqrt(K): min {min(stds):.3f} max {max(stds):.3f}; lm_head std {hs}")
        if expect is not None and abs(bpw - expect) > tol:
            raise Invalid(f"decoder layers average {bpw:.4f} bpw, expected {expect} +- {tol}")
    except Invalid as e:
        print(f"exl2_check: INVALID: {e}", file=sys.stderr)
        return 1
    except (OSError, KeyError, ValueError) as e:
        print(f"exl2_check: INVALID: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if not quiet:
        print("exl2_check: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
