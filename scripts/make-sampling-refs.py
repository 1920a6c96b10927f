#!/usr/bin/env python3
"""Writes tests/fixtures/text/sampling-ref.json: final sampling distributions for tests/unit/test_sampling.c.

A float64 numpy transcription of transformers 5.24 `generation/logits_process.py` (RepetitionPenaltyLogitsProcessor,
TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, TypicalLogitsWarper, applied in
that order as `GenerationMixin._get_logits_processor` does), plus the OpenAI frequency/presence penalty rule (as
vLLM applies it, after the repetition penalty) and an additive logit bias. It is kept independent of tessera's C
code: the warpers sort ascending and mask with -inf exactly as HF does. Each case holds float32-exact logits, the
parameters, the token history (prompt then generated), the biases and the expected probabilities (0 = removed).
Cases whose truncation decisions sit within 1e-4 of a boundary are redrawn, so float32 rounding on either side
cannot flip a decision. Run: python3 scripts/make-sampling-refs.py
"""
import json
import os

import numpy as np

VOCAB = 40
MARGIN = 1e-4


class Ambiguous(Exception):
    pass


def softmax(x):
    m = np.max(x)
    e = np.exp(x - m)
    return e / e.sum()


def log_softmax(x):
    m = np.max(x)
    return x - m - np.log(np.exp(x - m).sum())


def repetition(scores, ids, penalty):
    s = scores.copy()
    score = s[ids]  # torch.gather
    score = np.where(score < 0, score * penalty, score / penalty)
    s[ids] = score  # scatter (duplicates write the same value)
    return s


def openai_penalties(scores, generated, freq, presence):
    s = scores.copy()
    counts = np.bincount(np.asarray(generated, dtype=np.int64), minlength=len(s))[: len(s)]
    s -= freq * counts
    s -= presence * (counts > 0)
    return s


def top_k(scores, k):
    k = min(k, len(scores))
    kth = np.sort(scores)[::-1][k - 1]  # torch.topk(scores, k)[0][..., -1]
    finite = np.sort(scores[np.isfinite(scores)])[::-1]
    if k < len(finite) and abs(finite[k - 1] - finite[k]) < MARGIN:
        raise Ambiguous("top-k boundary")
    return np.where(scores < kth, -np.inf, scores)


def top_p(scores, p):
    order = np.argsort(scores, kind="stable")  # ascending
    cum = np.cumsum(softmax(scores[order]))
    remove = cum <= (1 - p)
    remove[-1] = False  # min_tokens_to_keep = 1
    live = np.isfinite(scores[order])
    if np.any(live & (np.abs(cum - (1 - p)) < MARGIN)):
        raise Ambiguous("top-p boundary")
    out = scores.copy()
    out[order[remove]] = -np.inf
    return out


def min_p(scores, mp):
    probs = softmax(scores)
    thr = mp * probs.max()
    remove = probs < thr
    remove[np.argmax(probs)] = False
    if np.any((probs > 0) & (np.abs(probs - thr) < MARGIN * probs.max())):
        raise Ambiguous("min-p boundary")
    return np.where(remove, -np.inf, scores)


def typical(scores, mass):
    with np.errstate(invalid="ignore", divide="ignore"):
        normalized = log_softmax(scores)
        p = np.exp(normalized)
        ent = -np.nansum(normalized * p)
        shifted = np.abs(-normalized - ent)
    order = np.argsort(shifted, kind="stable")
    sorted_scores = shifted[order]
    cum = np.cumsum(softmax(scores[order]))
    last_ind = min(int(np.sum(cum < mass)), len(scores) - 1)
    remove = sorted_scores > sorted_scores[last_ind]
    remove[:1] = False
    live = np.isfinite(sorted_scores)
    if np.any(live & (np.abs(cum - mass) < MARGIN)):
        raise Ambiguous("typical mass boundary")
    gaps = np.abs(sorted_scores[live] - sorted_scores[last_ind])
    if np.any((gaps > 0) & (gaps < MARGIN)):
        raise Ambiguous("typical score tie")
    out = scores.copy()
    out[order[remove]] = -np.inf
    return out


def final_probs(logits, c):
    s = logits.astype(np.float64)
    hist, n_prompt = c["history"], c["n_prompt"]
    if c["repetition_penalty"] not in (0.0, 1.0) and hist:
        s = repetition(s, np.array(hist, dtype=np.int64), c["repetition_penalty"])
    if (c["frequency_penalty"] or c["presence_penalty"]) and len(hist) > n_prompt:
        s = openai_penalties(s, hist[n_prompt:], c["frequency_penalty"], c["presence_penalty"])
    for tok, b in c["bias"]:
        s[tok] += b
    if c["temperature"] == 0 or c["top_k"] == 1:
        if np.sum(s == s.max()) > 1:
            raise Ambiguous("greedy tie")
        out = np.zeros(len(s))
        out[np.argmax(s)] = 1
        return out
    s = s / c["temperature"]
    if c["top_k"] > 0:
        s = top_k(s, c["top_k"])
    if c["top_p"] < 1:
        s = top_p(s, c["top_p"])
    if c["min_p"] > 0:
        s = min_p(s, c["min_p"])
    if 0 < c["typical_p"] < 1:
        s = typical(s, c["typical_p"])
    return softmax(s)


def case(**kw):
    c = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repetition_penalty=1.0,
             frequency_penalty=0.0, presence_penalty=0.0, history=[], n_prompt=0, bias=[], scale=2.0)
    c.update(kw)
    return c


CASES = [
    case(name="plain"),
    case(name="temperature", temperature=0.7),
    case(name="top-k 5", top_k=5),
    case(name="top-k 20 hot", top_k=20, temperature=1.3),
    case(name="top-p 0.9", top_p=0.9),
    case(name="top-p 0.5 cool", top_p=0.5, temperature=0.8),
    case(name="min-p 0.05", min_p=0.05),
    case(name="min-p 0.2 hot", min_p=0.2, temperature=1.5),
    case(name="typical 0.9", typical_p=0.9),
    case(name="typical 0.5", typical_p=0.5, temperature=0.9, scale=1.0),
    case(name="top-k + top-p", top_k=10, top_p=0.8),
    case(name="all filters", top_k=30, top_p=0.95, min_p=0.02, typical_p=0.9, temperature=1.1),
    case(name="repetition 1.3", repetition_penalty=1.3, history=[3, 7, 7, 12, 30, 3, 19], n_prompt=4),
    case(name="repetition 0.8 + top-p", repetition_penalty=0.8, top_p=0.9, history=[1, 2, 5, 8, 13, 21, 34],
         n_prompt=2),
    case(name="frequency + presence", frequency_penalty=0.5, presence_penalty=0.3,
         history=[0, 4, 9, 9, 9, 16, 4, 25, 36], n_prompt=3),
    case(name="everything", repetition_penalty=1.2, frequency_penalty=0.4, presence_penalty=-0.2, top_k=15,
         top_p=0.9, min_p=0.01, temperature=0.9, history=[2, 6, 6, 11, 17, 17, 17, 23], n_prompt=3,
         bias=[[5, 2.5], [17, -1.5], [39, 4.0]]),
    case(name="greedy with penalties", temperature=0.0, repetition_penalty=1.5, history=[0, 1, 2, 3, 4, 5],
         n_prompt=6, bias=[[10, 1.0]]),
]


def main():
    rng = np.random.default_rng(20261130)
    out = []
    for c in CASES:
        for _attempt in range(1000):
            logits = np.round(rng.normal(0.0, c["scale"], VOCAB), 3).astype(np.float32)
            try:
                probs = final_probs(logits, c)
                break
            except Ambiguous:
                continue
        else:
            raise SystemExit(f"case {c['name']}: no unambiguous logits found")
        item = {k: v for k, v in c.items() if k != "scale"}
        item["logits"] = [float(f"{x:.3f}") for x in logits]
        item["probs"] = [float(f"{p:.8g}") for p in probs]
        out.append(item)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "text",
                        "sampling-ref.json")
    with open(path, "w") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(item, separators=(",", ":")) for item in out))
        f.write("\n]\n")
    print(f"wrote {len(out)} cases to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
