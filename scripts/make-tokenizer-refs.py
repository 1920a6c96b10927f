#!/usr/bin/env python3
"""Make extra tokenizer references with Hugging Face `tokenizers` (pip install tokenizers).

Writes tests/fixtures/text/tokenizer-extra.json.xz, read by tests/text/test_tokenizer_ref.c:
  {"tokenizers_version": ..., "sets": [{"name", "base", "patch"?, "encodings": [{"text", "ids",
   "ids_with_special", "decoded"}], "decodes": [{"ids", "skip_special", "text"}]}]}
`base` names a fixture tokenizer (llama2, llama3, qwen3: tests/fixtures/tokenizers/<name>/tokenizer.json.xz;
tiny: models/tiny-llama-exl2-4.0bpw/tokenizer.json). `patch` replaces top-level keys of its tokenizer.json
("model" keys are merged), to cover components the fixture tokenizers do not use. decoded = decode(ids,
skip_special_tokens=False), as in tests/fixtures/reference/tokenizer-ref.json.

Usage: scripts/make-tokenizer-refs.py [--repo DIR]   (deterministic: fixed random seed)
"""
import argparse
import json
import lzma
import os
import random

from tokenizers import Tokenizer
import tokenizers

WS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2029", "\u200b", "\u0085", "\x0b",
      "\x0c", "\u2003", "\u202f", "\u205f", "\u1680"]
POOLS = [
    [chr(c) for c in range(0x20, 0x7F)],
    WS,
    [chr(c) for c in range(0xA1, 0x180)],
    [chr(c) for c in range(0x300, 0x370)],          # combining marks
    [chr(c) for c in range(0x370, 0x3FF)],          # Greek
    [chr(c) for c in range(0x400, 0x4FF)],          # Cyrillic
    [chr(c) for c in range(0x600, 0x6FF)],          # Arabic
    [chr(c) for c in range(0x900, 0x97F)],          # Devanagari
    [chr(c) for c in range(0xE00, 0xE7F)],          # Thai
    [chr(c) for c in range(0x3040, 0x30FF)],        # kana
    [chr(c) for c in range(0x4E00, 0x4F00)],        # CJK
    [chr(c) for c in range(0xAC00, 0xAD00)],        # Hangul
    [chr(c) for c in range(0x1F300, 0x1F650)],      # emoji
    ["\u200d", "\ufe0f", "\U0001F3FB", "\U0001F3FD", "\U0001F1FA\U0001F1F8",
     "\U0001F468\u200d\U0001F469\u200d\U0001F467"],
    ["\u017f", "\u212a", "\u0130", "\u0131", "\u00df", "\u03c2", "\u1e9e", "\ufb01", "\u2126", "\u00b5"],
    [chr(c) for c in range(0x660, 0x66A)] + [chr(c) for c in range(0xFF10, 0xFF1A)] + ["\u00b2", "\u2155", "\u216b"],
    ["\ue000", "\uf8ff", "\U00020000", "\U0002A6D6", "\U0001D518", "\ufffd", "\ufeff", "\U0010FFFD"],
    ["'s", "'S", "'t", "'RE", "'ve", "'M", "'ll", "'LL", "'d", "'D", "'\u017f", "n't", "N'T"],
    [str(random.Random(i).randint(0, 10 ** 9)) for i in range(30)],
]

HANDMADE = [
    "", " ", "  ", "\n", "a", "A", "\u00a0", "a\x00b", "\x00",
    "I'M SHOUTING, YOU'RE NOT, WE'LL SEE, THEY'D, IT'S, I'VE", "it'S mIxEd 'Ll 'vE 'rE",
    "don't won't can't shouldn't", "'s'S's", "''''", "'", "   '   s",
    "12345678901234567890123456789", "1,234,567.89 and -0.5e-10, 3rd 21st 1st", "\uff11\uff12\uff13 \u0661\u0662\u0663",
    " \n \n\n\t\t \r\n\r\n   \u3000\u3000x", "x \n\n\n\n\n", "\t\t\tindented\n\t\t\t\tmore", "trailing   \n",
    "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 family \U0001F1EF\U0001F1F5 flag \U0001F44D\U0001F3FF",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01 \u3053\u3093\u306b\u3061\u306f \uc548\ub155\ud558\uc138\uc694",
    "e\u0301 vs \u00e9, n\u0303 vs \u00f1, \u212b vs \u00c5, \ufb01 ligature, \u2460 circled",
    "<s>", "</s>", "<s></s>", " <s> ", "<unk>", "<|begin_of_text|>", "<|end_of_text|><|begin_of_text|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", "<|endoftext|>x<|endoftext|>",
    "<tool> call </tool>  <tool>x</tool>", "a<tool>b", "cat concat cat. cats", "zzqx zzqxzzqx (zzqx)",
    "Hello World HELLO WORLD hello world", "\u0130stanbul \u017fome K\u212aelvin",
    "\u2581already\u2581has\u2581metaspace", "\u2581", "\u2581\u2581 \u2581",
    "<0x41> literal byte token", "\ufffd replacement char \ufffd",
]


def random_text(rng, lo=1, hi=60):
    n = rng.randint(lo, hi)
    out = []
    for _ in range(n):
        pool = POOLS[rng.randrange(len(POOLS))]
        out.append(pool[rng.randrange(len(pool))])
    return "".join(out)


def long_text(rng, n_chars):
    parts = []
    words = ["the", "quick", "Brown", "fox", "don't", "JUMPS", "\u00fcber", "na\u00efve", "caf\u00e9", "\u65e5\u672c",
             "\u0434\u0430", "42", "3.14", "\U0001F600", "func(x)", "{}", "  ", "\n", "\t", "--", "...", "e\u0301"]
    size = 0
    while size < n_chars:
        if rng.random() < 0.1:
            w = random_text(rng, 1, 8)
        else:
            w = rng.choice(words)
        parts.append(w)
        parts.append(rng.choice([" ", " ", " ", "", "\n", ", ", ". "]))
        size += len(w) + 1
    return "".join(parts)


def encodings(tok, texts):
    out = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        out.append({"text": t, "ids": ids, "ids_with_special": tok.encode(t, add_special_tokens=True).ids,
                    "decoded": tok.decode(ids, skip_special_tokens=False)})
    return out


def decodes(tok, rng, n, extra_ids=()):
    vs = tok.get_vocab_size(with_added_tokens=True)
    out = []
    for i in range(n):
        length = rng.randint(1, 24)
        if i % 3 == 0 and extra_ids:
            ids = [rng.choice(extra_ids) for _ in range(length)]
        else:
            ids = [rng.randrange(vs + 3) for _ in range(length)]  # a few out-of-range ids too
        for skip in (False, True):
            out.append({"ids": ids, "skip_special": skip, "text": tok.decode(ids, skip_special_tokens=skip)})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    repo = os.path.abspath(args.repo)
    rng = random.Random(1234)

    def base_json(name):
        if name == "tiny":
            with open(os.path.join(repo, "models/tiny-llama-exl2-4.0bpw/tokenizer.json"), encoding="utf-8") as f:
                return json.load(f)
        with lzma.open(os.path.join(repo, f"tests/fixtures/tokenizers/{name}/tokenizer.json.xz"), "rt",
                       encoding="utf-8") as f:
            return json.load(f)

    def build(base, patch):
        j = base_json(base)
        for k, v in (patch or {}).items():
            if k == "model":
                j["model"].update(v)
            else:
                j[k] = v
        return Tokenizer.from_str(json.dumps(j))

    texts = HANDMADE + [random_text(rng) for _ in range(150)]
    long_texts = [long_text(rng, 6000), " " * 3000 + "x" + "\n" * 500 + "\t \t" * 300,
                  "a" * 5000, "\U0001F600" * 500 + "\u4e00" * 500, "1" * 4000]
    small = HANDMADE + [random_text(rng) for _ in range(40)]

    replace_meta = {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}
    sp_decoder = {"type": "Sequence", "decoders": [replace_meta, {"type": "ByteFallback"}, {"type": "Fuse"},
                                                   {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    extra_added = [
        {"id": 2048, "content": "<tool>", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False,
         "special": True},
        {"id": 2049, "content": "</tool>", "single_word": False, "lstrip": False, "rstrip": True,
         "normalized": False, "special": False},
        {"id": 2050, "content": "zzqx", "single_word": True, "lstrip": False, "rstrip": False, "normalized": True,
         "special": False},
        {"id": 2051, "content": "Hello World", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
    ]
    variants = [
        ("llama2", "llama2", None, texts + long_texts),
        ("llama3", "llama3", None, texts + long_texts),
        ("qwen3", "qwen3", None, texts + long_texts),
        ("tiny", "tiny", None, texts + long_texts[:2]),
        ("llama2-metaspace-first", "llama2",
         {"normalizer": None,
          "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
          "decoder": {"type": "Sequence", "decoders": [{"type": "Metaspace", "replacement": "\u2581",
                                                        "prepend_scheme": "first", "split": False},
                                                       {"type": "ByteFallback"}, {"type": "Fuse"}]}}, small),
        ("llama2-metaspace-always-split", "llama2",
         {"normalizer": None,
          "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
          "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}},
         small),
        ("llama2-unk-fused", "llama2", {"model": {"byte_fallback": False, "fuse_unk": True},
                                        "decoder": {"type": "Sequence", "decoders": [
                                            replace_meta, {"type": "Strip", "content": " ", "start": 0, "stop": 1},
                                            {"type": "Fuse"},
                                            {"type": "Strip", "content": " ", "start": 2, "stop": 0}]}}, small),
        ("llama2-unk-unfused", "llama2", {"model": {"byte_fallback": False, "fuse_unk": False}}, small),
        ("llama2-nfkd-lower-strip", "llama2",
         {"normalizer": {"type": "Sequence", "normalizers": [
             {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "NFKD"}, {"type": "Lowercase"},
             {"type": "Prepend", "prepend": "\u2581"},
             {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
          "decoder": sp_decoder}, small),
        ("llama2-nfkc-regex-replace", "llama2",
         {"normalizer": {"type": "Sequence", "normalizers": [
             {"type": "NFKC"}, {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
             {"type": "Prepend", "prepend": "\u2581"},
             {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}}, small),
        ("tiny-gpt2", "tiny",
         {"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
          "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
          "post_processor": {"type": "Sequence", "processors": [
              {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
              {"type": "TemplateProcessing",
               "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}},
                          {"SpecialToken": {"id": "<|end_of_text|>", "type_id": 0}}],
               "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
               "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [0],
                                                        "tokens": ["<|begin_of_text|>"]},
                                  "<|end_of_text|>": {"id": "<|end_of_text|>", "ids": [1],
                                                      "tokens": ["<|end_of_text|>"]}}}]},
          "added_tokens": base_json("tiny")["added_tokens"] + extra_added}, small),
        ("tiny-split-behaviors", "tiny",
         {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
             {"type": "Split", "pattern": {"Regex": "\\p{N}"}, "behavior": "MergedWithPrevious", "invert": False},
             {"type": "Split", "pattern": {"Regex": "[aeiou]"}, "behavior": "Contiguous", "invert": False},
             {"type": "Split", "pattern": {"String": ","}, "behavior": "Removed", "invert": False},
             {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": True},
             {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}},
         small),
        ("tiny-misc-nodecoder", "tiny",
         {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             {"type": "WhitespaceSplit"}, {"type": "Punctuation", "behavior": "Isolated"},
             {"type": "Digits", "individual_digits": True},
             {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": False}]},
          "decoder": None, "post_processor": None}, small),
        ("tiny-whitespace-invert", "tiny",
         {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             {"type": "Whitespace"},
             {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "MergedWithNext", "invert": True},
             {"type": "Digits", "individual_digits": False},
             {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}]}},
         small),
    ]

    sets = []
    for name, base, patch, tx in variants:
        tok = build(base, patch)
        byte_ids = []
        vocab = tok.get_vocab(with_added_tokens=True)
        for b in range(256):
            tid = vocab.get(f"<0x{b:02X}>")
            if tid is not None:
                byte_ids.append(tid)
        if not byte_ids:  # byte-level vocab: single-byte tokens of the high half make broken UTF-8
            byte_ids = [i for t, i in vocab.items() if len(t) == 1 and ord(t) >= 0x80][:200]
        entry = {"name": name, "base": base, "encodings": encodings(tok, tx),
                 "decodes": decodes(tok, rng, 60 if patch is None else 15, byte_ids)}
        if patch is not None:
            entry["patch"] = patch
        sets.append(entry)
        print(f"{name}: {len(entry['encodings'])} encodings, {len(entry['decodes'])} decodes")

    out_dir = os.path.join(repo, "tests/fixtures/text")
    os.makedirs(out_dir, exist_ok=True)
    data = json.dumps({"tokenizers_version": tokenizers.__version__, "sets": sets}, ensure_ascii=True,
                      separators=(",", ":"))
    path = os.path.join(out_dir, "tokenizer-extra.json.xz")
    with lzma.open(path, "wt", encoding="ascii", preset=9) as f:
        f.write(data)
    print(f"wrote {path}: {len(data)} bytes, {os.path.getsize(path)} compressed")


if __name__ == "__main__":
    main()
