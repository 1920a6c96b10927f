#!/usr/bin/env python3
"""Writes tests/fixtures/reference/rope-ref.json: RoPE inverse frequencies and attention factors for each rope type.

A float32 numpy transcription of transformers 5.24 `modeling_rope_utils` (_compute_default / linear / dynamic /
llama3 / yarn), kept independent of tessera's C code. Each case holds a complete config.json, the sequence length
passed to the function (dynamic NTK), and the expected values. Run: python3 scripts/make-rope-refs.py
"""
import json
import math
import os

import numpy as np

f32 = np.float32


def base_inv_freq(base, dim):
    return (f32(1.0) / (f32(base) ** (np.arange(0, dim, 2, dtype=np.int64).astype(f32) / f32(dim)))).astype(f32)


def default(c, p, seq):
    return base_inv_freq(p["rope_theta"], c["dim"]), 1.0


def linear(c, p, seq):
    inv, _ = default(c, p, seq)
    return (inv / f32(p["factor"])).astype(f32), 1.0


def dynamic(c, p, seq):
    dim, maxp, factor = c["dim"], c["max_position_embeddings"], p["factor"]
    seq = max(seq, maxp)
    base = p["rope_theta"] * ((factor * seq / maxp) - (factor - 1)) ** (dim / (dim - 2))
    return base_inv_freq(base, dim), 1.0


def llama3(c, p, seq):
    inv, _ = default(c, p, seq)
    factor, lo, hi, old = (p["factor"], p["low_freq_factor"], p["high_freq_factor"],
                           p["original_max_position_embeddings"])
    low_wl, high_wl = old / lo, old / hi
    wl = (f32(2 * math.pi) / inv).astype(f32)
    out = np.where(wl > low_wl, inv / f32(factor), inv).astype(f32)
    smooth = ((f32(old) / wl - f32(lo)) / f32(hi - lo)).astype(f32)
    smoothed = ((f32(1) - smooth) * out / f32(factor) + smooth * out).astype(f32)
    medium = ~(wl < high_wl) & ~(wl > low_wl)
    return np.where(medium, smoothed, out).astype(f32), 1.0


def yarn(c, p, seq):
    dim, base = c["dim"], p["rope_theta"]
    factor = p.get("factor")
    orig = p["original_max_position_embeddings"]
    if factor is None:
        factor = c["max_position_embeddings"] / orig
    att, mscale, mscale_all = p.get("attention_factor"), p.get("mscale"), p.get("mscale_all_dim")

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if att is None:
        att = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if (mscale and mscale_all)
               else get_mscale(factor))
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def corr(rot):
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1).astype(f32)
    pos = (f32(base) ** (np.arange(0, dim, 2).astype(f32) / f32(dim))).astype(f32)
    extra, inter = (f32(1) / pos).astype(f32), (f32(1) / (f32(factor) * pos)).astype(f32)
    ef = (f32(1) - ramp).astype(f32)
    return (inter * (f32(1) - ef) + extra * ef).astype(f32), float(att)


FUNCS = {"default": default, "linear": linear, "dynamic": dynamic, "llama3": llama3, "yarn": yarn}

BASE = {"architectures": ["LlamaForCausalLM"], "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 1024, "vocab_size": 256, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096}

CASES = [
    ("default", {"rope_theta": 10000.0}, 10),
    ("default", {"rope_theta": 500000.0}, 10),
    ("linear", {"rope_theta": 10000.0, "factor": 4.0}, 10),
    ("dynamic", {"rope_theta": 10000.0, "factor": 2.0}, 1000),
    ("dynamic", {"rope_theta": 10000.0, "factor": 2.0}, 9000),
    ("dynamic", {"rope_theta": 1000000.0, "factor": 4.0}, 40000),
    ("llama3", {"rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}, 10),
    ("llama3", {"rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256}, 10),
    ("yarn", {"rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024}, 10),
    ("yarn", {"rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768, "beta_fast": 16,
              "beta_slow": 2}, 10),
    ("yarn", {"rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
              "mscale_all_dim": 0.707}, 10),
    ("yarn", {"rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 512, "truncate": False,
              "attention_factor": 1.25}, 10),
    ("yarn", {"rope_theta": 10000.0, "original_max_position_embeddings": 1024}, 10),
]

out = []
for kind, params, seq in CASES:
    for head_dim in (64, 128):
        cfg = dict(BASE)
        cfg["head_dim"] = head_dim
        rp = dict(params)
        rp["rope_type"] = kind
        cfg["rope_parameters"] = rp
        inv, att = FUNCS[kind]({"dim": head_dim, "max_position_embeddings": cfg["max_position_embeddings"]}, rp, seq)
        out.append({"config": cfg, "seq_len": seq, "inv_freq": [float(x) for x in inv], "attention_factor": att})

# the older rope_scaling spelling with "type", and partial rotary
cfg = dict(BASE, head_dim=64, rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0})
inv, att = linear({"dim": 64}, {"rope_theta": 10000.0, "factor": 2.0}, 1)
out.append({"config": cfg, "seq_len": 1, "inv_freq": [float(x) for x in inv], "attention_factor": att})
cfg = dict(BASE, head_dim=64, rope_theta=10000.0, partial_rotary_factor=0.5)
inv, att = default({"dim": 32}, {"rope_theta": 10000.0}, 1)
out.append({"config": cfg, "seq_len": 1, "inv_freq": [float(x) for x in inv], "attention_factor": att})

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "reference", "rope-ref.json")
with open(path, "w") as f:
    json.dump(out, f)
print(f"wrote {len(out)} cases to {os.path.normpath(path)}")
