"""Soak run against tessera serve: mixed traffic for a bounded time, with the server's resources sampled.

Usage: soak.py --bin build/tessera --model models/tiny-llama-exl2-4.0bpw [--minutes 30] [--clients 16]
               [--sample-seconds 60] [--json out.json] [--serve-arg=--kv-tokens --serve-arg=16384 ...]

Starts `tessera serve` on a free loopback port and runs C client threads, each sending a random mix of:
  streaming completions (35 %), non-streaming chat completions (25 %), streams the client abandons after a few
  tokens (15 %), requests with a stop string or a short server-side timeout (10 %), invalid requests that must be
  answered 400 (10 %), and n = 2 sampled completions (5 %).
Every `--sample-seconds` it records the server's resident memory (VmRSS), open file descriptors, KV pages in use
and cached (/metrics), and the request counters. At the end it waits for the server to go idle and checks:
  - every request the clients sent got exactly one outcome of the kind its class allows (a 200 with a finish
    reason, the 400 for invalid ones, or an abandoned stream), and the server's request counters add up;
  - no KV page is held by a sequence once idle (used minus cached = 0; cached prefix pages may remain);
  - memory and descriptors are flat: after the first sample (warm-up: the KV pool and caches get touched), RSS
    grows by less than --rss-slack-mib and open descriptors by less than 16 (under sanitizers, TSR_SANITIZED set,
    the server runs with a 1 MiB AddressSanitizer quarantine, so that freed memory is reused as in a plain build).
Exits 0 when every check holds, 1 otherwise. Standard library only.
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time

PROMPTS = ["Once upon a time", "The capital of France is", "In a small village by the sea,",
           "Write a list of fruits:", "The robot opened the door and", "def fibonacci(n):"]


def proc_status(pid):
    rss = None
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = None
    return rss, fds


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(tessera_[a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
        if m and m.group(2) is None:
            out[m.group(1)] = float(m.group(3))
    return out


def held(m):
    """KV pages referenced by sequences: the used ones minus the unreferenced ones kept for the prefix cache."""
    return m.get("tessera_kv_pages_used", -1) - m.get("tessera_kv_pages_cached", 0)


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.bad = []

    def add(self, kind, outcome, detail=""):
        with self.lock:
            key = f"{kind}:{outcome}"
            self.counts[key] = self.counts.get(key, 0) + 1
            if outcome == "unexpected" and len(self.bad) < 20:
                self.bad.append(f"{kind}: {detail}")


def post(port, path, body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, body=json.dumps(body) if not isinstance(body, bytes) else body,
              headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def one_request(port, rng, tally):
    r = rng.random()
    prompt = rng.choice(PROMPTS)
    if r < 0.35:  # streaming completion, read to the end
        c, resp = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": rng.randint(4, 48),
                                                 "temperature": 0.7, "seed": rng.randint(0, 1 << 30),
                                                 "stream": True})
        body = resp.read().decode(errors="replace")
        c.close()
        ok = resp.status == 200 and "data: [DONE]" in body and '"finish_reason":"' in body.replace(" ", "")
        tally.add("stream", "ok" if ok else "unexpected", f"{resp.status} {body[-200:]}")
    elif r < 0.60:  # non-streaming chat
        c, resp = post(port, "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": prompt}], "max_tokens": rng.randint(4, 32),
                        "temperature": 0})
        body = resp.read()
        c.close()
        try:
            j = json.loads(body)
            ok = resp.status == 200 and j["choices"][0]["finish_reason"] in ("stop", "length")
        except (ValueError, KeyError, IndexError):
            ok = False
        tally.add("chat", "ok" if ok else "unexpected", f"{resp.status} {body[:200]!r}")
    elif r < 0.75:  # stream abandoned after a few frames
        c, resp = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 200, "stream": True,
                                                 "ignore_eos": True})
        if resp.status != 200:
            tally.add("abandon", "unexpected", f"status {resp.status}")
            c.close()
            return
        for _ in range(rng.randint(1, 4)):
            resp.fp.readline()
        c.sock.shutdown(socket.SHUT_RDWR)
        c.close()
        tally.add("abandon", "ok")
    elif r < 0.85:  # stop string, or a timeout the server enforces
        if rng.random() < 0.5:
            body = {"prompt": prompt, "max_tokens": 32, "stop": ["e"], "temperature": 0}
        else:
            body = {"prompt": prompt, "max_tokens": 2000, "ignore_eos": True, "timeout": 0.2}
        c, resp = post(port, "/v1/completions", body)
        data = resp.read()
        c.close()
        try:
            j = json.loads(data)
            ok = resp.status == 200 and j["choices"][0]["finish_reason"] in ("stop", "length", "abort")
        except (ValueError, KeyError, IndexError):
            ok = False
        tally.add("stop_or_timeout", "ok" if ok else "unexpected", f"{resp.status} {data[:200]!r}")
    elif r < 0.95:  # invalid requests: must be 400 with a JSON error
        bad = rng.choice([b"{not json", json.dumps({"prompt": prompt, "max_tokens": -3}).encode(),
                          json.dumps({"prompt": prompt, "temperature": "hot"}).encode(),
                          json.dumps({"messages": "nope"}).encode(), b'{"prompt": "\\ud800"}'])
        path = "/v1/chat/completions" if b"messages" in bad else "/v1/completions"
        c, resp = post(port, path, bad)
        data = resp.read()
        c.close()
        ok = resp.status == 400 and b'"error"' in data
        tally.add("invalid", "ok" if ok else "unexpected", f"{resp.status} {data[:200]!r}")
    else:  # n = 2
        c, resp = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 8, "n": 2, "temperature": 1.0,
                                                 "seed": rng.randint(0, 1 << 30)})
        data = resp.read()
        c.close()
        try:
            ok = resp.status == 200 and len(json.loads(data)["choices"]) == 2
        except (ValueError, KeyError):
            ok = False
        tally.add("n2", "ok" if ok else "unexpected", f"{resp.status} {data[:200]!r}")


def client(port, seed, stop_at, tally):
    rng = random.Random(seed)
    while time.time() < stop_at:
        try:
            one_request(port, rng, tally)
        except (OSError, http.client.HTTPException) as e:
            tally.add("transport", "unexpected", repr(e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--sample-seconds", type=float, default=60)
    ap.add_argument("--rss-slack-mib", type=float, default=24)
    ap.add_argument("--json", default="")
    ap.add_argument("--serve-arg", action="append", default=[])
    a = ap.parse_args()

    log = open(os.environ.get("TSR_SOAK_LOG", "/dev/null"), "w")
    env = dict(os.environ)
    if env.get("TSR_SANITIZED"):
        # AddressSanitizer holds freed blocks in a quarantine (256 MiB by default) before reusing them, so a sanitized
        # server's RSS climbs with allocation churn alone; a small quarantine makes RSS measure what is retained
        env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS", ""), "quarantine_size_mb=1"]))
    srv = subprocess.Popen([a.bin, "serve", "--model", a.model, "--port", "0"] + a.serve_arg,
                           stderr=subprocess.PIPE, stdout=log, text=True, env=env)
    port = None
    deadline = time.time() + 60
    while time.time() < deadline and port is None:
        line = srv.stderr.readline()
        if not line:
            break
        log.write(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
    if port is None:
        print("FAIL: the server did not start")
        srv.kill()
        return 1
    threading.Thread(target=lambda: [log.write(l) for l in srv.stderr], daemon=True).start()
    while metrics(port).get("tessera_ready", 0) != 1:
        time.sleep(0.1)

    tally = Tally()
    start = time.time()
    stop_at = start + a.minutes * 60
    threads = [threading.Thread(target=client, args=(port, 1000 + i, stop_at, tally)) for i in range(a.clients)]
    for t in threads:
        t.start()
    samples = []

    def sample():
        rss, fds = proc_status(srv.pid)
        m = metrics(port)
        s = {"t": round(time.time() - start, 1), "rss_mib": round(rss, 1), "fds": fds,
             "kv_held": held(m), "kv_cached": m.get("tessera_kv_pages_cached"),
             "requests": m.get("tessera_requests_total"), "finished": m.get("tessera_requests_finished_total"),
             "cancelled": m.get("tessera_requests_cancelled_total"), "failed": m.get("tessera_requests_failed_total")}
        samples.append(s)
        print("  %7.1f s  rss %7.1f MiB  fds %4d  kv pages held %5d cached %5d  requests %7d" %
              (s["t"], s["rss_mib"], s["fds"], s["kv_held"], s["kv_cached"] or 0, s["requests"] or 0), flush=True)

    sample()
    while time.time() < stop_at:
        time.sleep(min(a.sample_seconds, max(0.0, stop_at - time.time())))
        sample()
    for t in threads:
        t.join()
    # idle: abandoned streams are cancelled within the server's disconnect detection
    idle_by = time.time() + 30
    while time.time() < idle_by:
        m = metrics(port)
        if m.get("tessera_running_sequences", 1) == 0 and m.get("tessera_queue_length", 1) == 0 and \
                held(m) == 0:
            break
        time.sleep(0.2)
    sample()
    final = metrics(port)
    srv.terminate()
    try:
        rc = srv.wait(timeout=30)
    except subprocess.TimeoutExpired:
        srv.kill()
        rc = "killed"

    problems = []
    sent = sum(v for k, v in tally.counts.items())
    unexpected = sum(v for k, v in tally.counts.items() if k.endswith(":unexpected"))
    if unexpected:
        problems.append(f"{unexpected} requests with an unexpected outcome: {tally.bad[:5]}")
    if held(final) != 0:
        problems.append(f"KV pages still held by sequences when idle: {held(final)}")
    if final.get("tessera_running_sequences", -1) != 0:
        problems.append("sequences still running when idle")
    # every admitted request had exactly one final event (finished counts the failed and cancelled ones too)
    admitted = final.get("tessera_requests_total", 0)
    ended = final.get("tessera_requests_finished_total", 0)
    if admitted != ended:
        problems.append(f"server counters: {admitted:.0f} requests admitted, {ended:.0f} ended")
    warm = samples[1] if len(samples) > 2 else samples[0]
    rss_growth = samples[-1]["rss_mib"] - warm["rss_mib"]
    fd_growth = samples[-1]["fds"] - warm["fds"]
    if rss_growth > a.rss_slack_mib:
        problems.append(f"RSS grew by {rss_growth:.1f} MiB after warm-up")
    if fd_growth >= 16:
        problems.append(f"open descriptors grew by {fd_growth}")
    if rc != 0:
        problems.append(f"server exit status {rc} after SIGTERM")
    summary = {"minutes": a.minutes, "clients": a.clients, "client_requests": sent, "outcomes": tally.counts,
               "server": {k: final.get(k) for k in ("tessera_requests_total", "tessera_requests_finished_total",
                                                   "tessera_requests_cancelled_total",
                                                   "tessera_requests_failed_total",
                                                   "tessera_generation_tokens_total",
                                                   "tessera_http_client_disconnects_total")},
               "rss_growth_after_warmup_mib": round(rss_growth, 1), "fd_growth": fd_growth, "samples": samples,
               "server_exit": rc, "problems": problems}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"client requests {sent}: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.counts.items())))
    print(f"server: admitted {admitted:.0f}, ended {ended:.0f}; RSS growth after warm-up {rss_growth:.1f} MiB, "
          f"descriptors {fd_growth:+d}; exit {rc}")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
