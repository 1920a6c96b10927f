"""Throughput parity between `tessera batch` and `tessera serve` (not part of CTest): the same N completion
requests (sampled with per-request seeds, fixed max_tokens, EOS ignored so every request costs the same) through
a batch file with --max-running C, and through the HTTP server with C concurrent non-streaming clients.
Prints generated tokens per second of wall time for both and their ratio.

Usage: parity.py --bin build/tessera --model models/tiny-llama-exl2-4.0bpw [--requests 256] [--concurrency 64]
                 [--max-tokens 64] [--kv-tokens 65536] [--port 8125]
Standard library only.
"""
import argparse
import http.client
import json
import os
import subprocess
import tempfile
import threading
import time


def bodies(n, max_tokens):
    return [{"prompt": f"Client {i % 64} request {i // 64}: once upon a time", "max_tokens": max_tokens,
             "temperature": 0.8, "seed": i, "ignore_eos": True} for i in range(n)]


def run_batch(a, reqs, tmp):
    src, dst = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
    with open(src, "w") as f:
        for i, b in enumerate(reqs):
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": b}) + "\n")
    t0 = time.monotonic()
    subprocess.run([a.bin, "batch", "--model", a.model, "--input", src, "--output", dst, "--max-running",
                    str(a.concurrency), "--kv-tokens", str(a.kv_tokens), "--quiet"], check=True)
    wall = time.monotonic() - t0
    tokens = 0
    with open(dst) as f:
        for line in f:
            tokens += json.loads(line)["response"]["body"]["usage"]["completion_tokens"]
    return wall, tokens


def run_serve(a, reqs):
    srv = subprocess.Popen([a.bin, "serve", "--model", a.model, "--port", str(a.port), "--max-running",
                            str(a.concurrency), "--kv-tokens", str(a.kv_tokens)], stderr=subprocess.PIPE, text=True)
    try:
        for line in srv.stderr:
            if "ready" in line:
                break
        lock, todo, tokens = threading.Lock(), list(range(len(reqs))), [0]

        def client():
            conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=600)
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                conn.request("POST", "/v1/completions", body=json.dumps(reqs[i]),
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                obj = json.loads(r.read())
                if r.status != 200:
                    raise RuntimeError(obj)
                with lock:
                    tokens[0] += obj["usage"]["completion_tokens"]

        t0 = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(a.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.monotonic() - t0, tokens[0]
    finally:
        srv.terminate()
        srv.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/tessera")
    ap.add_argument("--model", default="models/tiny-llama-exl2-4.0bpw")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kv-tokens", type=int, default=65536)
    ap.add_argument("--port", type=int, default=8125)
    a = ap.parse_args()
    reqs = bodies(a.requests, a.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        bw, bt = run_batch(a, reqs, tmp)
    sw, st = run_serve(a, reqs)
    print(f"batch: {bt} tokens in {bw:.1f} s = {bt / bw:.1f} tok/s")
    print(f"serve: {st} tokens in {sw:.1f} s = {st / sw:.1f} tok/s")
    print(f"serve / batch = {(st / sw) / (bt / bw):.3f}")


if __name__ == "__main__":
    main()
