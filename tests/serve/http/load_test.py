"""Load run against tessera serve (not part of CTest): C concurrent clients stream completions for D seconds.

Usage: load_test.py --url http://127.0.0.1:8000 [--key KEY] [--clients 64] [--seconds 300] [--max-tokens 64]
                    [--pid SERVER_PID]
Prints requests/s, tokens/s, p50/p99 time to first token and inter-token latency (client side, per SSE frame),
errors, and with --pid the server's resident memory at the start and the end. Standard library only.
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse


def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--key", default="")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--pid", type=int, default=0)
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    lock = threading.Lock()
    ttft, itl, errors = [], [], []
    done = {"requests": 0, "tokens": 0}
    end = time.monotonic() + a.seconds
    headers = {"Content-Type": "application/json"}
    if a.key:
        headers["Authorization"] = f"Bearer {a.key}"

    def worker(i):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        n = 0
        while time.monotonic() < end:
            body = json.dumps({"prompt": f"Client {i} request {n}: once upon a time", "max_tokens": a.max_tokens,
                               "temperature": 0.8, "seed": i * 100000 + n, "stream": True,
                               "stream_options": {"include_usage": True}})
            n += 1
            t0 = time.monotonic()
            try:
                conn.request("POST", "/v1/completions", body=body, headers=headers)
                r = conn.getresponse()
                if r.status != 200:
                    raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
                first, last, my_itl, tokens, finished = None, None, [], 0, False
                buf = b""
                while True:
                    chunk = r.read1(65536)
                    if not chunk:
                        break
                    buf += chunk
                    while b"\n\n" in buf:
                        frame, buf = buf.split(b"\n\n", 1)
                        now = time.monotonic()
                        data = frame[6:]
                        if data == b"[DONE]":
                            finished = True
                            continue
                        obj = json.loads(data)
                        if "error" in obj:
                            raise RuntimeError(obj["error"]["message"])
                        if obj.get("usage"):
                            tokens = obj["usage"]["completion_tokens"]
                        elif obj["choices"] and obj["choices"][0]["text"]:
                            if first is None:
                                first = now - t0
                            else:
                                my_itl.append(now - last)
                            last = now
                if not finished:
                    raise RuntimeError("stream ended without [DONE]")
                with lock:
                    done["requests"] += 1
                    done["tokens"] += tokens
                    if first is not None:
                        ttft.append(first)
                    itl.extend(my_itl)
            except Exception as e:  # noqa: BLE001 - count every failure
                with lock:
                    errors.append(repr(e))
                conn.close()
                conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)

    rss0 = rss_kib(a.pid) if a.pid else None
    t_start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t_start
    rss1 = rss_kib(a.pid) if a.pid else None
    print(f"clients {a.clients}, {wall:.1f} s, max_tokens {a.max_tokens}")
    print(f"requests {done['requests']} ({done['requests'] / wall:.2f}/s), tokens {done['tokens']} "
          f"({done['tokens'] / wall:.1f}/s), errors {len(errors)}")
    print(f"TTFT p50 {pct(ttft, 50) * 1000:.1f} ms, p99 {pct(ttft, 99) * 1000:.1f} ms; "
          f"ITL p50 {pct(itl, 50) * 1000:.1f} ms, p99 {pct(itl, 99) * 1000:.1f} ms")
    if a.pid:
        print(f"server RSS start {rss0} KiB, end {rss1} KiB")
    for e in errors[:5]:
        print("error:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
