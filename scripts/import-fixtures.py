#!/usr/bin/env python3
"""Copies the fixtures the tests use from the shared fixture folder (default ../shared/fixtures) into the repo.

What it writes, and why it is reshaped:
  models/tiny-llama-exl2-4.0bpw/          the bundled default model, verbatim (also used by the tests)
  tests/fixtures/models/<name>/           the other fixture models, verbatim
  tests/fixtures/reference/*.xz           the ExLlamaV2 / HF reference files, xz-compressed (the build
                                          decompresses them into build/fixtures/): the ExLlamaV2 ones byte for
                                          byte; of the HF ones, logits.3 keeps only its last 64 rows (as the
                                          ExLlamaV2 references do), to keep the repo small
  tests/fixtures/reference/prompts.json   verbatim
  tests/fixtures/tokenizers/*             tokenizer files, large ones xz-compressed
  tests/fixtures/reference/tokenizer-ref.json
Run it again after the shared fixtures change; it is idempotent.
"""
import lzma
import os
import shutil
import sys

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(here)
src = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "..", "shared", "fixtures"))

BUNDLED = "tiny-llama-exl2-4.0bpw"
TEST_MODELS = ["tiny-llama-exl2-2.5bpw", "tiny-llama-exl2-8.0bpw", "tiny-qwen2-exl2-4.65bpw",
               "tiny-llama-fp16", "tiny-qwen2-fp16",
               "tiny-llama-gptq-4bit-g128", "tiny-qwen2-gptq-4bit-g128-actorder"]
REFERENCES = ["tiny-llama-exl2-2.5bpw.exl2-ref", "tiny-llama-exl2-4.0bpw.exl2-ref",
              "tiny-llama-exl2-8.0bpw.exl2-ref", "tiny-qwen2-exl2-4.65bpw.exl2-ref",
              "tiny-llama.hf-ref", "tiny-qwen2.hf-ref",
              "tiny-llama-gptq-4bit-g128.exllamav2-ref", "tiny-qwen2-gptq-4bit-g128-actorder.exllamav2-ref"]


def copy_dir(a, b):
    os.makedirs(b, exist_ok=True)
    for f in sorted(os.listdir(a)):
        shutil.copyfile(os.path.join(a, f), os.path.join(b, f))
        os.chmod(os.path.join(b, f), 0o644)


def xz_bytes(data, b):
    if os.path.exists(b):
        with lzma.open(b, "rb") as fo:
            if fo.read() == data:
                return
    with lzma.open(b, "wb", preset=9) as fo:
        fo.write(data)


def xz_file(a, b):
    with open(a, "rb") as fi:
        xz_bytes(fi.read(), b)


def trimmed_hf_ref(path, keep_rows=64):
    """The HF reference with logits.3 cut to its last keep_rows rows (a safetensors image, bytes)."""
    import json
    import struct
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out_header, blobs, off = {}, [], 0
    for name in sorted(k for k in header if k != "__metadata__"):
        meta = header[name]
        b, e = meta["data_offsets"]
        blob, shape = raw[base + b:base + e], list(meta["shape"])
        if name == "logits.3" and shape[0] > keep_rows:
            row = len(blob) // shape[0]
            blob, shape[0] = blob[-keep_rows * row:], keep_rows
        out_header[name] = {"dtype": meta["dtype"], "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


copy_dir(os.path.join(src, "models", BUNDLED), os.path.join(repo, "models", BUNDLED))
for m in TEST_MODELS:
    copy_dir(os.path.join(src, "models", m), os.path.join(repo, "tests", "fixtures", "models", m))
refdir = os.path.join(repo, "tests", "fixtures", "reference")
os.makedirs(refdir, exist_ok=True)
for r in REFERENCES:
    a, b = os.path.join(src, "reference", r + ".safetensors"), os.path.join(refdir, r + ".safetensors.xz")
    if r.endswith(".hf-ref"):
        xz_bytes(trimmed_hf_ref(a), b)
    else:
        xz_file(a, b)
for f in ["prompts.json", "tokenizer-ref.json"]:
    shutil.copyfile(os.path.join(src, "reference", f), os.path.join(refdir, f))
for t in sorted(os.listdir(os.path.join(src, "tokenizers"))):
    d = os.path.join(repo, "tests", "fixtures", "tokenizers", t)
    os.makedirs(d, exist_ok=True)
    for f in sorted(os.listdir(os.path.join(src, "tokenizers", t))):
        a = os.path.join(src, "tokenizers", t, f)
        if os.path.getsize(a) > 256 * 1024:
            xz_file(a, os.path.join(d, f + ".xz"))
        else:
            shutil.copyfile(a, os.path.join(d, f))
print("fixtures imported from", src)
