#!/usr/bin/env python3
"""When each SSE event of one streamed response reaches the client, for perf/event_delay.sh.

Usage: event_times.py PORT PATH BODY_FILE ROUNDS

Sends ROUNDS requests one after the other on one keep-alive connection to 127.0.0.1:PORT and
prints, for each response, one line of JSON: the milliseconds from sending the request to the
arrival of each `data:` event (the read that completed it), and how many reads the events took.
Chunked framing is followed to find the response's end; events are counted in the decoded body.
"""
import json
import socket
import sys
import time


def read_response(sock, sent):
    """Reads one chunked response; returns (event arrival times in ms, reads with an event)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise SystemExit("connection closed before the head")
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    status = head.split(b"\r\n", 1)[0]
    if b" 200 " not in status:
        raise SystemExit(f"status line: {status!r}")
    if b"chunked" not in head.lower():
        raise SystemExit("the response is not chunked")
    body, raw, times, reads, done = b"", rest, [], 0, False
    arrived = time.perf_counter()
    while True:
        # Decode every whole chunk in `raw`.
        while True:
            line_end = raw.find(b"\r\n")
            if line_end < 0:
                break
            size = int(raw[:line_end].split(b";")[0], 16)
            if len(raw) < line_end + 2 + size + 2:
                break
            body += raw[line_end + 2:line_end + 2 + size]
            raw = raw[line_end + 2 + size + 2:]
            if size == 0:
                done = True
                break
        events = body.count(b"data:")
        if events > len(times):
            reads += 1
            times += [round((arrived - sent) * 1000, 2)] * (events - len(times))
        if done:
            return times, reads
        data = sock.recv(65536)
        if not data:
            raise SystemExit("connection closed mid-response")
        arrived = time.perf_counter()
        raw += data


def main():
    port, path, body_file, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    body = open(body_file, "rb").read()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    sock = socket.create_connection(("127.0.0.1", int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(rounds):
        sent = time.perf_counter()
        sock.sendall(request)
        times, reads = read_response(sock, sent)
        print(json.dumps({"events_ms": times, "reads": reads}))


if __name__ == "__main__":
    main()
