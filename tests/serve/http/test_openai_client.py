"""tessera serve through the official `openai` Python package: completions, chat, streaming, usage, logprobs,
stop strings, seeds, logit_bias, errors (400/401/404/413) and concurrent clients, against a running server.

Usage: test_openai_client.py BASE_URL API_KEY MODEL
Exits 0 when every check passes; prints the failing check and exits 1 otherwise.
"""
import sys
import threading

import openai
from openai import OpenAI

base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print("FAIL:", what)
        sys.exit(1)
    checks += 1


def expect_status(exc_type, status, fn, needle=None):
    try:
        fn()
    except exc_type as e:
        check(e.status_code == status, f"status {e.status_code} != {status}: {e}")
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error", body) if isinstance(body, dict) else {}
        for k in ("message", "type", "param", "code"):
            check(k in err, f"error object lacks '{k}': {e.body}")
        if needle:
            check(needle in str(err.get("message")), f"'{needle}' not in '{err.get('message')}'")
        return err
    check(False, f"expected {exc_type.__name__} ({status})")


# --- models -----------------------------------------------------------------------------------------------
models = client.models.list()
check([m.id for m in models.data] == [model], f"models: {models}")

# --- completions ------------------------------------------------------------------------------------------
r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0)
check(r.object == "text_completion" and len(r.choices) == 1, f"completion: {r}")
check("there was a little girl" in r.choices[0].text, f"greedy text: {r.choices[0].text!r}")
check(r.choices[0].finish_reason == "length", f"finish: {r.choices[0].finish_reason}")
u = r.usage
check(u.completion_tokens == 8 and u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + 8, f"usage: {u}")
check(u.prompt_tokens_details is not None and u.prompt_tokens_details.cached_tokens is not None, f"usage: {u}")
r2 = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0)
check(r2.choices[0].text == r.choices[0].text, "greedy is deterministic")

# seeds: same seed same text; n gives n choices
a = client.completions.create(model=model, prompt="Hello", max_tokens=12, temperature=1.0, seed=42, n=3)
b = client.completions.create(model=model, prompt="Hello", max_tokens=12, temperature=1.0, seed=42, n=3)
check(len(a.choices) == 3 and [c.index for c in a.choices] == [0, 1, 2], f"n=3: {a.choices}")
check([c.text for c in a.choices] == [c.text for c in b.choices], "same seed, same samples")
check(len({c.text for c in a.choices}) > 1, f"n choices differ: {[c.text for c in a.choices]}")
check(0 < a.usage.completion_tokens <= 36, f"usage of n=3: {a.usage}")

# prompt forms: token ids, several prompts
ids = client.completions.create(model=model, prompt=[0, 1392, 1329, 263, 680], max_tokens=4, temperature=0)
check(ids.usage.prompt_tokens == 5, f"id prompt usage: {ids.usage}")
multi = client.completions.create(model=model, prompt=["One", "Two"], max_tokens=2, temperature=0)
check(len(multi.choices) == 2, f"two prompts: {multi.choices}")

# echo
e = client.completions.create(model=model, prompt="Once upon a time", max_tokens=3, temperature=0, echo=True)
check(e.choices[0].text.startswith("Once upon a time,"), f"echo: {e.choices[0].text!r}")

# stop strings: the text ends before the stop, finish_reason stop
full = client.completions.create(model=model, prompt="Once upon a time", max_tokens=20, temperature=0).choices[0].text
stop_word = "little"
s = client.completions.create(model=model, prompt="Once upon a time", max_tokens=20, temperature=0, stop=[stop_word])
check(s.choices[0].finish_reason == "stop", f"stop finish: {s.choices[0]}")
check(s.choices[0].text == full[: full.index(stop_word)], f"stop text: {s.choices[0].text!r} vs {full!r}")
s1 = client.completions.create(model=model, prompt="Once upon a time", max_tokens=20, temperature=0, stop=stop_word)
check(s1.choices[0].text == s.choices[0].text, "stop as a string")

# logprobs (completions: an integer)
lp = client.completions.create(model=model, prompt="Once upon a time", max_tokens=4, temperature=0, logprobs=2)
L = lp.choices[0].logprobs
check(L is not None and len(L.tokens) == 4 and len(L.token_logprobs) == 4, f"logprobs: {L}")
check(all(len(t) == 2 for t in L.top_logprobs) and all(x <= 0 for x in L.token_logprobs), f"top: {L.top_logprobs}")
check(L.text_offset == sorted(L.text_offset), "text offsets ascend")
check("".join(L.tokens) == lp.choices[0].text, f"tokens {L.tokens} vs text {lp.choices[0].text!r}")

# logit_bias: +100 on one token makes it every token
one = client.completions.create(model=model, prompt="Hi", max_tokens=1, temperature=0, logit_bias={"300": 100})
three = client.completions.create(model=model, prompt="Hi", max_tokens=3, temperature=0, logit_bias={"300": 100})
check(three.choices[0].text == one.choices[0].text * 3,
      f"logit_bias: {one.choices[0].text!r} {three.choices[0].text!r}")

# extra sampling parameters are accepted (vLLM's names)
x = client.completions.create(model=model, prompt="Hi", max_tokens=4, temperature=0.8, top_p=0.9, seed=1,
                              frequency_penalty=0.5, presence_penalty=0.5,
                              extra_body={"top_k": 20, "min_p": 0.05, "typical_p": 0.9, "repetition_penalty": 1.1,
                                          "min_tokens": 2, "ignore_eos": True})
check(x.usage.completion_tokens == 4, f"extra sampling: {x.usage}")

# prefix cache: the same long prompt twice reports cached prompt tokens the second time
long_prompt = "The quick brown fox jumps over the lazy dog. " * 8
client.completions.create(model=model, prompt=long_prompt, max_tokens=1, temperature=0)
c2 = client.completions.create(model=model, prompt=long_prompt, max_tokens=1, temperature=0)
check(c2.usage.prompt_tokens_details.cached_tokens >= 16, f"cached tokens: {c2.usage}")

# --- chat -------------------------------------------------------------------------------------------------
msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Tell me a story."}]
c = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, temperature=0)
check(c.object == "chat.completion" and c.choices[0].message.role == "assistant", f"chat: {c}")
check(isinstance(c.choices[0].message.content, str) and c.usage.completion_tokens <= 8, f"chat: {c}")
c_new = client.chat.completions.create(model=model, messages=msgs, max_completion_tokens=8, temperature=0)
check(c_new.choices[0].message.content == c.choices[0].message.content, "max_completion_tokens")

cl = client.chat.completions.create(model=model, messages=msgs, max_tokens=3, temperature=0, logprobs=True,
                                    top_logprobs=2)
content = cl.choices[0].logprobs.content
check(len(content) >= 1 and all(len(t.top_logprobs) == 2 for t in content), f"chat logprobs: {content}")
check(all(isinstance(t.bytes, list) for t in content), "chat logprob bytes")

# streaming chat with usage
pieces, finish, usage, roles = [], None, None, 0
stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0, stream=True,
                                        stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
        check(chunk.choices == [], "the usage chunk has no choices")
        continue
    d = chunk.choices[0].delta
    if d.role:
        roles += 1
    if d.content:
        pieces.append(d.content)
    if chunk.choices[0].finish_reason:
        finish = chunk.choices[0].finish_reason
check(roles == 1 and finish in ("stop", "length"), f"stream roles {roles} finish {finish}")
check(usage is not None and usage.completion_tokens <= 10, f"stream usage {usage}")
plain = client.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=0)
check("".join(pieces) == plain.choices[0].message.content,
      f"stream {''.join(pieces)!r} vs {plain.choices[0].message.content!r}")

# streaming completions
text = "".join(ch.choices[0].text for ch in client.completions.create(
    model=model, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True) if ch.choices)
check(text == r.choices[0].text, f"streamed completion {text!r} vs {r.choices[0].text!r}")

# --- errors -----------------------------------------------------------------------------------------------
bad = OpenAI(base_url=base, api_key="wrong-key", max_retries=0)
expect_status(openai.AuthenticationError, 401, lambda: bad.models.list())
expect_status(openai.AuthenticationError, 401,
              lambda: bad.completions.create(model=model, prompt="x", max_tokens=1))
expect_status(openai.NotFoundError, 404, lambda: client.completions.create(model="gpt-5", prompt="x", max_tokens=1),
              "gpt-5")
expect_status(openai.BadRequestError, 400,
              lambda: client.completions.create(model=model, prompt="x", max_tokens=1, temperature=-3))
err = expect_status(openai.BadRequestError, 400,
                    lambda: client.completions.create(model=model, prompt="Hello there", max_tokens=5000))
check("2048" in err["message"] and "5000" in err["message"], f"context message: {err['message']}")
check(err.get("code") == "context_length_exceeded", f"code: {err}")
expect_status(openai.BadRequestError, 400,
              lambda: client.chat.completions.create(model=model, messages=[], max_tokens=1))
expect_status(openai.APIStatusError, 413,
              lambda: client.completions.create(model=model, prompt="a " * 40000, max_tokens=1))

# --- concurrent clients -----------------------------------------------------------------------------------
results, errors = [None] * 8, []


def worker(i):
    try:
        s = client.chat.completions.create(model=model, messages=[{"role": "user", "content": f"Story {i}"}],
                                           max_tokens=12, temperature=0.7, seed=i, stream=(i % 2 == 0))
        if i % 2 == 0:
            results[i] = "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
        else:
            results[i] = s.choices[0].message.content
    except Exception as e:  # noqa: BLE001 - report every failure
        errors.append(f"client {i}: {e!r}")


threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check(not errors, f"concurrent: {errors}")
check(all(isinstance(x, str) for x in results), f"concurrent results: {results}")

print(f"openai client: {checks} checks passed")
