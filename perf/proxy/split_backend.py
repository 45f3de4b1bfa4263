#!/usr/bin/env python3
"""A backend that writes each response's head and body in two sends, as uvicorn does (the head on
`http.response.start`, the body on `http.response.body`), for perf/proxy_syscalls.sh
(BACKEND=split). Keep-alive HTTP/1.1, TCP_NODELAY, one thread per connection, 127.0.0.1 only.
The chat answer is the same JSON as perf/proxy/backend-nginx.conf's; /health and /metrics
answer warmpath's control thread.

Usage: split_backend.py PORT [GAP_MS]   (GAP_MS, default 1: the pause between head and body, so
that they reach the router as two reads)
"""

import socket
import sys
import threading
import time

CHAT = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench-model",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":9,"total_tokens":21}}'
)
METRICS = b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"


def serve(conn: socket.socket, gap: float) -> None:
    try:
        answer(conn, gap)
    except OSError:  # the router closed the connection (at its shutdown)
        pass


def answer(conn: socket.socket, gap: float) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    with conn:
        while True:
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            while len(buf) < length:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            buf = buf[length:]
            target = head.split(b" ")[1]
            body, ctype = CHAT, b"application/json"
            if target == b"/metrics":
                body, ctype = METRICS, b"text/plain"
            elif target == b"/health":
                body, ctype = b"ok\n", b"text/plain"
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype
                + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
            )
            if target not in (b"/metrics", b"/health"):
                time.sleep(gap)
            conn.sendall(body)


def main() -> None:
    port = int(sys.argv[1])
    gap = float(sys.argv[2] if len(sys.argv) > 2 else 1) / 1000
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1024)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, gap), daemon=True).start()


if __name__ == "__main__":
    main()
