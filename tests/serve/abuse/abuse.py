"""Network abuse against a running `tessera serve`, standard library only (socket, threading, json).

    abuse.py --port PORT --pid SERVER_PID --conn-timeout S --header-timeout S --max-body BYTES --kv-bytes BYTES
             [--figures OUT.json]

While a well-behaved client keeps asking for the same greedy completion (each must succeed, give the same text,
and come back within 10x the baseline latency, or 3 s when that is more: it shares the batch with the abusers'
requests on a small machine), the phases below run one after another:

  slowloris   200 connections that trickle header bytes and 20 that trickle body bytes, one every 0.5 s: all
              closed by the header timeout
  stalled     the server stopped (SIGSTOP) for longer than both timeouts while two clients send their requests:
              both answered once it runs again (the time is the server's, not the clients')
  unread      a stream with a tiny receive buffer that never reads: cancelled past the stream backlog
              (tessera_http_stream_overflows_total) and closed; then 50 at once: all cancelled (past the backlog,
              or at the connection timeout when the machine is too slow to fill it first,
              tessera_http_client_disconnects_total), nothing keeps running, every one closed, memory bounded
  idle        as many idle connections as the descriptor limit allows, up to 10000: the server still answers,
              then closes every one after the header timeout
  oversized   a 1 MiB header line, 10000 header lines (431), a 1 MiB URL (414), a body over --max-body with
              Content-Length (413) and chunked (413 or closed), five times each, no memory growth
  json        invalid UTF-8, lone surrogate escapes, NUL bytes, 100k nested brackets, path-like model names:
              a 400 (404 for the model) with an OpenAI-style JSON error; a foreign Host or Origin header (DNS
              rebinding against a loopback server): 403

The server's VmRSS is printed before and after each phase (and its peak during it); growth beyond the KV pool
(--kv-bytes) must stay under 64 MiB. Exits non-zero naming the first broken expectation.
"""
import argparse
import http.client
import json
import os
import resource
import selectors
import signal
import socket
import statistics
import sys
import threading
import time

KEY = "abuse-test-key-0123456789"  # the server runs with --api-key KEY: it must never show up in its log
PROMPT = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
RSS_SLACK = 64 << 20


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def request(port, method, path, body=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {KEY}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def metric(port, name):
    _, body = request(port, "GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def completion(port):
    t = time.monotonic()
    status, body = request(port, "POST", "/v1/completions", json.dumps(PROMPT))
    dt = time.monotonic() - t
    if status != 200:
        return None, dt, f"status {status}: {body[:200]!r}"
    return json.loads(body)["choices"][0]["text"], dt, None


def raw_post(body, close=False):
    """A POST /v1/completions with the API key, as bytes, for clients that drive the socket themselves."""
    connection = "Connection: close\r\n" if close else ""
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{connection}\r\n").encode() + body


def read_response(s):
    """Reads a Connection: close answer to its end; returns (status, body), status 0 when none came back."""
    got = b""
    while d := s.recv(65536):
        got += d
    head, _, body = got.partition(b"\r\n\r\n")
    return (int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.") else 0), body


class NormalClient(threading.Thread):
    """Keeps making the same greedy completion; records failures instead of raising."""

    def __init__(self, port, text, bound):
        super().__init__(daemon=True)
        self.port, self.text, self.bound = port, text, bound
        self.stop = threading.Event()
        self.gate = threading.Lock()  # held around each request; a phase takes it to pause the client
        self.lock = threading.Lock()
        self.count, self.errors, self.worst = 0, [], 0.0

    def run(self):
        while not self.stop.is_set():
            with self.gate:
                try:
                    text, dt, err = completion(self.port)
                except OSError as e:
                    text, dt, err = None, 0.0, f"{type(e).__name__}: {e}"
            with self.lock:
                self.count += 1
                self.worst = max(self.worst, dt)
                if err:
                    self.errors.append(err)
                elif text != self.text:
                    self.errors.append(f"text {text!r} != {self.text!r}")
                elif dt > self.bound:
                    self.errors.append(f"took {dt:.2f} s (bound {self.bound:.2f} s)")
            time.sleep(0.05)

    def take(self):
        with self.lock:
            out = (self.count, list(self.errors), self.worst)
            self.count, self.errors, self.worst = 0, [], 0.0
        return out


class RssWatch(threading.Thread):
    """Samples the server's RSS every 100 ms; peak() since the last reset."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.top, self.lock = pid, 0, threading.Lock()

    def run(self):
        while True:
            r = rss(self.pid)
            with self.lock:
                self.top = max(self.top, r)
            time.sleep(0.1)

    def reset(self):
        with self.lock:
            self.top = rss(self.pid)

    def peak(self):
        with self.lock:
            return self.top


def closed(sock):
    """True when the peer closed or reset the connection (the socket is readable with EOF or an error)."""
    try:
        while True:
            data = sock.recv(65536, socket.MSG_DONTWAIT)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def wait_closed(socks, deadline, trickle=None):
    """Waits until every socket is closed by the server or the deadline passes; with trickle, sends one byte on
    each open socket every 0.5 s meanwhile. Returns (number closed, seconds until the last one closed)."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    t0, open_, last = time.monotonic(), len(socks), 0.0
    next_trickle = t0
    while open_ and time.monotonic() < deadline:
        if trickle and time.monotonic() >= next_trickle:
            for key in list(sel.get_map().values()):
                try:
                    key.fileobj.send(trickle)
                except OSError:
                    pass
            next_trickle += 0.5
        for key, _ in sel.select(timeout=0.1):
            if closed(key.fileobj):
                sel.unregister(key.fileobj)
                open_ -= 1
                last = time.monotonic() - t0
    sel.close()
    return len(socks) - open_, last


class Run:
    def __init__(self, args):
        self.a = args
        self.port, self.pid = args.port, args.pid
        self.figures = {"phases": []}
        self.watch = RssWatch(self.pid)
        self.watch.start()

    def phase(self, name, fn):
        self.watch.reset()
        before = rss(self.pid)
        self.client.take()
        t = time.monotonic()
        detail = fn()
        took = time.monotonic() - t
        n, errors, worst = self.client.take()
        after, peak = rss(self.pid), self.watch.peak()
        print(f"[{name}] {took:.1f} s; server RSS {before / 2**20:.1f} MiB before, peak {peak / 2**20:.1f}, "
              f"after {after / 2**20:.1f}; normal client: {n} completions, worst {worst:.3f} s; {detail}",
              flush=True)
        self.figures["phases"].append({"phase": name, "seconds": round(took, 1), "rss_before": before,
                                       "rss_peak": peak, "rss_after": after, "normal_requests": n,
                                       "normal_worst_s": round(worst, 3), "detail": detail})
        if errors:
            fail(f"[{name}] the normal client failed {len(errors)} of {n}: {errors[:3]}")
        if n == 0:  # a phase shorter than one completion: check one now
            text, dt, err = completion(self.port)
            if err or text != self.text or dt > self.client.bound:
                fail(f"[{name}] a completion right after: {err or text!r} in {dt:.2f} s")
        if peak > self.rss0 + self.a.kv_bytes + RSS_SLACK:
            fail(f"[{name}] server RSS peaked at {peak / 2**20:.1f} MiB, over {self.rss0 / 2**20:.1f} MiB at start "
                 f"+ KV pool {self.a.kv_bytes / 2**20:.0f} MiB + {RSS_SLACK >> 20} MiB")
        if request(self.port, "GET", "/health")[0] != 200:
            fail(f"[{name}] /health is not 200 afterwards")

    # --- phases ------------------------------------------------------------------------------------------------

    def slowloris(self):
        socks = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", self.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(s)
        for _ in range(20):  # slow POST: whole headers, then a body one byte at a time
            s = socket.create_connection(("127.0.0.1", self.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() +
                      b"\r\nContent-Length: 100000\r\n\r\n{")
            socks.append(s)
        limit = self.a.header_timeout
        n, last = wait_closed(socks, time.monotonic() + limit + 10, trickle=b"a")
        for s in socks:
            s.close()
        if n != len(socks):
            fail(f"slowloris: {len(socks) - n} of {len(socks)} trickling connections still open {limit + 10} s later")
        if last > limit + 3:
            fail(f"slowloris: the last connection closed after {last:.1f} s (header timeout {limit} s)")
        swept = metric(self.port, "tessera_http_header_timeouts_total")
        if swept < len(socks):
            fail(f"slowloris: tessera_http_header_timeouts_total is {swept}")
        self.figures["slowloris"] = {"connections": len(socks), "last_closed_s": round(last, 1)}
        return f"{n} trickling connections (200 in headers, 20 in bodies) closed, the last after {last:.1f} s"

    def stalled(self):
        """Requests sent while the server cannot run (a loaded machine, at its worst) are answered once it can."""
        post = raw_post(json.dumps(PROMPT).encode(), close=True)
        get = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        stall = max(self.a.conn_timeout, self.a.header_timeout) + 1.5
        with self.client.gate:  # the normal client waits: its latency bound is not the point here
            socks = [socket.create_connection(("127.0.0.1", self.port), timeout=stall + 30) for _ in range(2)]
            time.sleep(0.5)  # accepted: the header clock runs
            os.kill(self.pid, signal.SIGSTOP)
            try:
                socks[0].sendall(post)
                socks[1].sendall(get)
                time.sleep(stall)
            finally:
                os.kill(self.pid, signal.SIGCONT)
            answers = []
            for s in socks:
                try:
                    answers.append(read_response(s))
                except OSError as e:
                    fail(f"stalled: {type(e).__name__}: {e}")
                finally:
                    s.close()
        for what, (status, body) in zip(("POST /v1/completions", "GET /metrics"), answers):
            if status != 200:
                fail(f"stalled: {what} sent while the server was stopped for {stall:.1f} s got status {status} "
                     f"(0: closed unanswered) {body[:80]!r} instead of a 200")
        text = json.loads(answers[0][1])["choices"][0]["text"]
        if text != self.text:
            fail(f"stalled: the completion's text {text!r} != {self.text!r}")
        return f"a completion and /metrics sent during a {stall:.1f} s stop both answered"

    def open_unread(self, n):
        """n streaming requests on sockets with a tiny receive buffer, never read."""
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True,
                           "temperature": 0, "stream": True, "logprobs": 20}).encode()
        request = raw_post(body)
        socks = []
        for _ in range(n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", self.port))
            s.sendall(request)
            socks.append(s)
        return socks

    def cancelled(self):
        return (metric(self.port, "tessera_http_stream_overflows_total"),
                metric(self.port, "tessera_http_client_disconnects_total"))

    def wait_cancelled(self, n, since, seconds):
        """Waits until n more streams were cancelled (for their backlog or at the connection timeout)."""
        deadline = time.monotonic() + seconds
        while True:
            over, gone = (x - y for x, y in zip(self.cancelled(), since))
            if over + gone >= n or time.monotonic() > deadline:
                return over, gone
            time.sleep(0.25)

    def wait_quiet(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if metric(self.port, "tessera_running_sequences") == 0 and \
                    metric(self.port, "tessera_queue_length") == 0:
                return
            time.sleep(0.1)
        fail("unread: sequences still running after the streams were cancelled")

    def unread(self):
        # one alone generates fast enough to pass its backlog before the connection timeout
        since = self.cancelled()
        socks = self.open_unread(1)
        over, gone = self.wait_cancelled(1, since, self.a.conn_timeout + 30)
        if over != 1:
            fail(f"unread: a lone stream nobody reads was not cancelled for its backlog ({over} {gone})")
        self.wait_quiet(10)
        if wait_closed(socks, time.monotonic() + 5)[0] != 1:
            fail("unread: the lone stream past its backlog was not closed")
        socks[0].close()
        # fifty share the machine: on a slow one the connection timeout may come first; either way they end
        since = self.cancelled()
        t0 = time.monotonic()
        socks = self.open_unread(50)
        over, gone = self.wait_cancelled(len(socks), since, self.a.conn_timeout + 60)
        t_cancel = time.monotonic() - t0
        if over + gone < len(socks):
            fail(f"unread: only {over + gone:.0f} of {len(socks)} unread streams were cancelled")
        self.wait_quiet(10)
        n, _ = wait_closed(socks, time.monotonic() + self.a.conn_timeout + 5)
        for s in socks:
            s.close()
        if n != len(socks):
            fail(f"unread: {len(socks) - n} of {len(socks)} unread streams still open")
        self.figures["unread"] = {"streams": len(socks), "backlog_cancels": over, "timeout_cancels": gone,
                                  "cancelled_within_s": round(t_cancel, 1)}
        return (f"a lone unread stream cancelled past its backlog; {len(socks)} unread streams cancelled within "
                f"{t_cancel:.1f} s ({over:.0f} past the backlog, {gone:.0f} at the connection timeout), all closed")

    def idle(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 10000
        room = (hard if hard != resource.RLIM_INFINITY else 1 << 20) - 500
        n_max = min(want, room)
        if n_max < want:
            print(f"[idle] the descriptor hard limit is {hard}: opening {n_max} idle connections, not {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n_max + 500, hard), hard))
        swept0 = metric(self.port, "tessera_http_header_timeouts_total")
        socks = []
        t = time.monotonic()
        for _ in range(n_max):
            try:
                socks.append(socket.create_connection(("127.0.0.1", self.port), timeout=10))
            except OSError as e:
                fail(f"idle: connection {len(socks) + 1} failed: {e}")
        t_open = time.monotonic() - t
        # the kernel completes a connect() before the server accepts it: wait until every one was accepted (held
        # now, or already closed by the header timeout); the /metrics connection itself is one of those held
        deadline, held = time.monotonic() + 10, 0
        while time.monotonic() < deadline:
            now_held = metric(self.port, "tessera_http_connections") - 1
            held = max(held, now_held)
            if now_held + metric(self.port, "tessera_http_header_timeouts_total") - swept0 >= len(socks):
                break
            time.sleep(0.05)
        else:
            fail(f"idle: the server accepted only {now_held:.0f} of {len(socks)} connections")
        rss_held = rss(self.pid)
        text, dt, err = completion(self.port)
        if err or text != self.text:
            fail(f"idle: a completion with {len(socks)} idle connections open: {err or text}")
        limit = self.a.header_timeout + 15
        n, last = wait_closed(socks, time.monotonic() + limit)
        for s in socks:
            s.close()
        if n != len(socks):
            fail(f"idle: {len(socks) - n} of {len(socks)} idle connections still open after {limit} s")
        self.figures["idle"] = {"connections": len(socks), "open_seconds": round(t_open, 2),
                                "rss_held": rss_held, "closed_after_s": round(last, 1),
                                "completion_s": round(dt, 3)}
        return (f"{len(socks)} idle connections opened in {t_open:.1f} s, server held up to {held:.0f} at once "
                f"(RSS {rss_held / 2**20:.1f} MiB), a completion took {dt:.3f} s meanwhile, all closed after "
                f"{last:.1f} s")

    def raw(self, data, chunk=65536):
        """Sends data (the server may stop reading and close); returns the status code read back, or 0 when the
        connection was closed without one."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=20)
        try:
            for i in range(0, len(data), chunk):
                try:
                    s.sendall(data[i:i + chunk])
                except OSError:
                    break
            got = b""
            try:
                while b"\r\n" not in got:
                    d = s.recv(4096)
                    if not d:
                        break
                    got += d
            except OSError:
                pass
            if got.startswith(b"HTTP/1."):
                return int(got.split(b" ", 2)[1])
            return 0
        finally:
            s.close()

    def raw_response(self, data):
        """Sends one request with Connection: close; returns (status, body)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=20)
        try:
            s.sendall(data)
            return read_response(s)
        finally:
            s.close()

    def oversized(self):
        big = self.a.max_body + (2 << 20)
        post = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n"
        cases = {
            "1 MiB header line": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (1 << 20) +
                                 b"\r\n\r\n",
            "10000 header lines": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                                  b"".join(b"X-H%d: v\r\n" % i for i in range(10000)) + b"\r\n",
            "1 MiB URL": b"GET /" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "Content-Length over --max-body": post + b"Content-Length: %d\r\n\r\n" % (1 << 40),
            "chunked body over --max-body": post + b"Transfer-Encoding: chunked\r\n\r\n" +
                                            (b"10000\r\n" + b"a" * 65536 + b"\r\n") * (big >> 16),
        }
        want = {"1 MiB header line": (431, 0), "10000 header lines": (431, 0), "1 MiB URL": (414, 0),
                "Content-Length over --max-body": (413,), "chunked body over --max-body": (413, 0)}
        out = []
        for name, data in cases.items():
            for _ in range(5):
                code = self.raw(data)
                if code not in want[name]:
                    fail(f"oversized: {name} answered {code or 'nothing (closed)'}, not one of {want[name]}")
            out.append(f"{name}: {code or 'closed'}")
        return "; ".join(out)

    def json_cases(self):
        cases = [
            ("invalid UTF-8", b'{"prompt": "\xff\xfe abc", "max_tokens": 1}', 400),
            ("truncated UTF-8", b'{"prompt": "abc \xc3", "max_tokens": 1}', 400),
            ("overlong UTF-8", b'{"prompt": "\xc0\xaf", "max_tokens": 1}', 400),
            ("UTF-8 surrogate", b'{"prompt": "\xed\xa0\x80", "max_tokens": 1}', 400),
            ("lone high surrogate", b'{"prompt": "a\\ud800b", "max_tokens": 1}', 400),
            ("lone low surrogate", b'{"prompt": "\\udc00", "max_tokens": 1}', 400),
            ("NUL escape", b'{"prompt": "a\\u0000b", "max_tokens": 1}', 400),
            ("raw NUL in a string", b'{"prompt": "a\x00b", "max_tokens": 1}', 400),
            ("raw NUL after the object", b'{"prompt": "a", "max_tokens": 1}\x00', 400),
            ("100k [", b"[" * 100000, 400),
            ("100k [ in a field", b'{"prompt": ' + b"[" * 100000, 400),
            ("50k nested objects", b'{"a":' * 50000 + b"1" + b"}" * 50000, 400),
            ("invalid UTF-8 in a key", b'{"\xff": 1, "prompt": "x", "max_tokens": 1}', 400),
            ("invalid UTF-8 in model", b'{"model": "\xc3(", "prompt": "x"}', 400),
            ("model as a path", b'{"model": "../../../etc/passwd", "prompt": "x", "max_tokens": 1}', 404),
            ("model as the model folder", b'{"model": "models/tiny-llama-exl2-4.0bpw", "prompt": "x"}', 404),
        ]
        for name, body, want in cases:
            for path in ("/v1/completions", "/v1/chat/completions"):
                status, answer = request(self.port, "POST", path, body)
                if status != want:
                    fail(f"json: {name} on {path} answered {status}, not {want}: {answer[:200]!r}")
                try:
                    err = json.loads(answer)["error"]
                    assert isinstance(err["message"], str) and err["type"]
                except (ValueError, KeyError, TypeError, AssertionError):
                    fail(f"json: {name} on {path}: not an OpenAI error: {answer[:200]!r}")
        status, answer = self.raw_response(b"GET /v1/\xff\xfe%00 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                           b"Connection: close\r\n\r\n")
        if status != 404 or "error" not in json.loads(answer):
            fail(f"json: a path with invalid UTF-8 answered {status}: {answer[:200]!r}")
        # DNS rebinding: on a loopback address, another host name or a foreign web page gets 403
        auth = b"Authorization: Bearer " + KEY.encode() + b"\r\nConnection: close\r\n\r\n"
        for name, head, want in (
                ("Host evil.example", b"Host: evil.example:8000\r\n", 403),
                ("Origin evil.example", b"Host: 127.0.0.1\r\nOrigin: http://evil.example\r\n", 403),
                ("Origin localhost", b"Host: localhost\r\nOrigin: http://localhost:3000\r\n", 200)):
            status, answer = self.raw_response(b"GET /v1/models HTTP/1.1\r\n" + head + auth)
            if status != want:
                fail(f"json: {name} answered {status}, not {want}: {answer[:200]!r}")
        return (f"{len(cases)} bodies x 2 routes answered with JSON errors; an invalid UTF-8 path got 404; "
                f"a foreign Host or Origin got 403")

    # --- driver ------------------------------------------------------------------------------------------------

    def main(self):
        lat, text = [], None
        for _ in range(5):
            t, dt, err = completion(self.port)
            if err:
                fail(f"baseline completion: {err}")
            if text is not None and t != text:
                fail(f"greedy text changed: {t!r} vs {text!r}")
            text = t
            lat.append(dt)
        self.text = text
        base = statistics.median(lat)
        bound = max(10 * base, 3.0)
        if os.environ.get("TSR_SANITIZED"):
            # a sanitizer build runs the model ~10x slower, so the normal client waits behind the abusers' long
            # sequences (scheduler fairness, not an abuse bound): only its correctness is checked there
            bound = 120.0
        self.rss0 = rss(self.pid)
        self.figures.update({"baseline_s": round(base, 4), "bound_s": round(bound, 3), "rss_start": self.rss0,
                             "kv_bytes": self.a.kv_bytes})
        print(f"baseline: {text!r} in {base * 1000:.1f} ms (bound {bound:.2f} s); server RSS "
              f"{self.rss0 / 2**20:.1f} MiB", flush=True)
        self.client = NormalClient(self.port, text, bound)
        self.client.start()
        time.sleep(0.3)
        for name, fn in (("slowloris", self.slowloris), ("stalled", self.stalled), ("unread", self.unread),
                         ("idle", self.idle), ("oversized", self.oversized), ("json", self.json_cases)):
            self.phase(name, fn)
        self.client.stop.set()
        self.client.join()
        self.figures["rss_end"] = rss(self.pid)
        if self.a.figures:
            with open(self.a.figures, "w") as f:
                json.dump(self.figures, f, indent=1)
        print(f"ok: server RSS {self.rss0 / 2**20:.1f} MiB at start, {self.figures['rss_end'] / 2**20:.1f} MiB "
              f"at the end")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--conn-timeout", type=float, required=True, help="the server's --conn-timeout")
    p.add_argument("--header-timeout", type=float, required=True, help="the server's --header-timeout")
    p.add_argument("--max-body", type=int, required=True)
    p.add_argument("--kv-bytes", type=int, required=True, help="size of the server's KV pool")
    p.add_argument("--figures")
    Run(p.parse_args()).main()
