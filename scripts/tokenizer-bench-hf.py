#!/usr/bin/env python3
"""One-thread Hugging Face tokenizers encode benchmark, the counterpart of build/tests/text/tok_bench.
Usage: RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false scripts/tokenizer-bench-hf.py TOKENIZER_JSON TEXTFILE"""
import sys, time, os
from tokenizers import Tokenizer
path, textfile = sys.argv[1], sys.argv[2]
t0 = time.perf_counter(); tok = Tokenizer.from_file(path); load = time.perf_counter() - t0
text = open(textfile, encoding='utf-8', newline='').read()
n = len(text.encode())
lines = text.split('\n')
bw = bl = 1e30
for r in range(3):
    t0 = time.perf_counter(); ids = tok.encode(text, add_special_tokens=False).ids
    bw = min(bw, time.perf_counter() - t0)
    t0 = time.perf_counter(); nl = sum(len(tok.encode(l, add_special_tokens=False).ids) for l in lines)
    bl = min(bl, time.perf_counter() - t0)
print(f"load {load*1e3:.1f} ms | whole text: {n} bytes -> {len(ids)} tokens, {n/bw/1e6:.2f} MB/s"
      f" | per line: {nl} tokens, {n/bl/1e6:.2f} MB/s")
