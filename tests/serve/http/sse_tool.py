"""Small HTTP helpers for test_http.sh, standard library only.

  sse_tool.py frames FILE              check a server-sent-events body: every frame is `data: <json>` followed by
                                       a blank line, the last is `data: [DONE]`; prints the number of JSON frames
  sse_tool.py disconnect PORT KEY      start a long streaming request, read the first frame, then hang up
  sse_tool.py stream PORT KEY N OUT    run a streaming completion of N tokens and write the raw body to OUT
                                       (OUT.started appears once the first bytes arrived)
  sse_tool.py metric PORT NAME         print the value of one metric from /metrics
"""
import http.client
import json
import socket
import sys


def frames(path):
    body = open(path, "rb").read().decode("utf-8")
    if not body.endswith("\n\n"):
        sys.exit(f"body does not end with a blank line: {body[-40:]!r}")
    parts = body[:-2].split("\n\n")
    if parts[-1] != "data: [DONE]":
        sys.exit(f"last frame is {parts[-1]!r}")
    n = 0
    for p in parts[:-1]:
        if not p.startswith("data: ") or "\n" in p:
            sys.exit(f"bad frame {p!r}")
        json.loads(p[6:])
        n += 1
    print(n)


def request_bytes(port, key, body):
    data = json.dumps(body).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


def disconnect(port, key):
    s = socket.create_connection(("127.0.0.1", int(port)), timeout=30)
    s.sendall(request_bytes(port, key, {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True,
                                        "temperature": 0, "stream": True}))
    got = b""
    while b"data: {" not in got:
        chunk = s.recv(4096)
        if not chunk:
            sys.exit("the server closed the stream before the first frame")
        got += chunk
    s.close()
    print("disconnected after the first frame")


def stream(port, key, n, out):
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
    c.request("POST", "/v1/completions",
              body=json.dumps({"prompt": "Once upon a time", "max_tokens": int(n), "ignore_eos": True,
                               "temperature": 0, "stream": True}),
              headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = c.getresponse()
    data = b""
    try:
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
            if not chunk:
                break
            if not data:
                open(out + ".started", "w").close()
            data += chunk
    except (http.client.IncompleteRead, ConnectionError) as e:
        data += getattr(e, "partial", b"")
    open(out, "wb").write(data)
    print(r.status)


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            print(line.rsplit(" ", 1)[1])
            return
    sys.exit(f"no metric {name}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"frames": frames, "disconnect": disconnect, "stream": stream, "metric": metric}[cmd](*args)
