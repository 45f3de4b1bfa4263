#!/usr/bin/env python3
"""The scale-out test's driver and checks (perf/scale_out_test.sh starts the processes).

Multi-turn chat sessions go through HAProxy, which hashes on X-Session-ID (consistent hashing)
to two warmpath replicas and names the one that answered in X-Replica; the replicas run with
debug_headers, so each response also says its lane (normal, boosted, forced) and engine.
Phases, each a few turns of every session (sessions run concurrently, turns of one session in
order, each turn's prompt extending the previous prompt and answer):

  both     both replicas up. Every turn of a session reaches the same replica; every follow-up
           is boosted (the replica's tracker holds its session); the replicas' /metrics agree
           with the headers (boosted + forced admissions per replica).
  remove   replica r1 gets SIGTERM while the phase runs (it drains, HAProxy's health check on
           /healthz marks it down, connections it refuses are resent to r2). Every request
           still succeeds; r2's sessions stay on r2 and stay boosted; each of r1's sessions
           moves to r2 once, and loses its boost exactly once: its first turn on r2 is normal,
           the following ones boosted.
  readd    r1 is started again (an empty tracker). The sessions that hash to r1, and only
           those, come back to it and lose their boost once more; r2's sessions do not move.

Exit status 0 when every check passed, 1 otherwise; one line per check on stdout.
Standard library only.
"""

import argparse
import http.client
import json
import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

BOOSTED = ("boosted", "forced")


class Session:
    def __init__(self, sid, seed):
        self.sid = sid
        self.rng = random.Random(seed)
        self.messages = [{"role": "system", "content": "you answer questions about routers"}]
        self.turns = []  # (phase, status, replica, lane, backend, error)

    def turn(self, port, phase, words, answer_tokens):
        user = " ".join(f"w{self.rng.randrange(10_000)}" for _ in range(words))
        self.messages.append({"role": "user", "content": user})
        body = json.dumps({"model": "sim-8b", "messages": self.messages, "stream": True,
                           "max_tokens": answer_tokens})
        status, replica, lane, backend, error, answer = 0, None, None, None, None, ""
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/v1/chat/completions", body,
                         {"Content-Type": "application/json", "X-Session-ID": self.sid})
            response = conn.getresponse()
            status = response.status
            replica = response.getheader("X-Replica")
            lane = response.getheader("x-warmpath-lane")
            backend = response.getheader("x-warmpath-backend")
            text = response.read().decode()
            conn.close()
            for event in text.split("\n\n"):
                if event.startswith("data: {"):
                    for choice in json.loads(event[6:]).get("choices", []):
                        answer += choice.get("delta", {}).get("content", "")
        except (OSError, http.client.HTTPException, ValueError) as e:
            error = f"{type(e).__name__}: {e}"
        self.messages.append({"role": "assistant", "content": answer})
        self.turns.append((phase, status, replica, lane, backend, error))
        return status == 200 and error is None


def drive(sessions, port, phase, turns, args, during=None):
    """`turns` rounds; in each, every session sends one turn, concurrently. `during` runs once,
    when a third of the first round's turns have been answered, while the rest are in flight."""
    answered = [0]
    lock = threading.Lock()
    fired = threading.Event()

    def one(session):
        time.sleep(session.rng.uniform(0, args.think_ms / 1000))
        session.turn(port, phase, args.words, args.answer_tokens)
        with lock:
            answered[0] += 1
            due = during is not None and not fired.is_set() and answered[0] >= len(sessions) // 3
            if due:
                fired.set()
        if due:
            during()

    with ThreadPoolExecutor(args.concurrency) as pool:
        for _ in range(turns):
            list(pool.map(one, sessions))


def replica_counts(admin_port):
    """(boosted + forced admissions, all admissions) from a replica's /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    boosted = total = 0
    for lane, value in re.findall(r'^warmpath_admitted_total\{[^}]*lane="(\w+)"[^}]*\} (\S+)$',
                                  text, re.M):
        total += float(value)
        if lane in BOOSTED:
            boosted += float(value)
    return boosted, total


class Checks:
    def __init__(self):
        self.failed = 0

    def check(self, ok, what):
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        self.failed += 0 if ok else 1


def wait_up(port, path, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def haproxy_state(stats_port):
    """{server: status} from HAProxy's CSV stats page."""
    conn = http.client.HTTPConnection("127.0.0.1", stats_port, timeout=2)
    conn.request("GET", "/stats;csv")
    rows = conn.getresponse().read().decode().splitlines()
    header = rows[0].lstrip("# ").split(",")
    out = {}
    for row in rows[1:]:
        cells = dict(zip(header, row.split(",")))
        if cells.get("pxname") == "replicas" and cells.get("svname") not in ("FRONTEND", "BACKEND"):
            out[cells["svname"]] = cells.get("status")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--haproxy-port", type=int, required=True)
    p.add_argument("--stats-port", type=int, required=True)
    p.add_argument("--admin", action="append", required=True, metavar="NAME=PORT",
                   help="a replica's admin port (r1=..., r2=...)")
    p.add_argument("--r1-pid", type=int, required=True, help="replica r1's pid (to stop)")
    p.add_argument("--r1-start", required=True, help="shell command that starts r1 again "
                   "and prints its pid")
    p.add_argument("--r1-port", type=int, required=True)
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=3, help="turns per session per phase")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--words", type=int, default=40, help="new words per user turn")
    p.add_argument("--answer-tokens", type=int, default=8)
    p.add_argument("--think-ms", type=float, default=40)
    args = p.parse_args()
    admin = dict(a.split("=") for a in args.admin)
    admin = {k: int(v) for k, v in admin.items()}
    c = Checks()

    sessions = [Session(f"session-{i:03d}", i) for i in range(args.sessions)]

    # --- both replicas ---
    before = {r: replica_counts(port) for r, port in admin.items()}
    drive(sessions, args.haproxy_port, "both", args.turns, args)
    turns = [t for s in sessions for t in s.turns]
    c.check(all(t[1] == 200 and t[5] is None for t in turns),
            f"both: {len(turns)} turns, all 200 "
            f"({sum(t[1] != 200 or t[5] is not None for t in turns)} failed)")
    home = {}
    for s in sessions:
        replicas = {t[2] for t in s.turns}
        if len(replicas) == 1:
            home[s.sid] = replicas.pop()
    c.check(len(home) == len(sessions),
            f"both: every session's turns reached one replica ({len(home)} of {len(sessions)})")
    spread = {r: sum(1 for h in home.values() if h == r) for r in admin}
    c.check(all(n > 0 for n in spread.values()), f"both: sessions per replica {spread}")
    follow = [t for s in sessions for t in s.turns[1:]]
    c.check(all(t[3] in BOOSTED for t in follow),
            f"both: every follow-up boosted ({sum(t[3] in BOOSTED for t in follow)} of {len(follow)})")
    c.check(all(t[3] == "normal" for s in sessions for t in s.turns[:1]),
            "both: every first turn in the normal lane")
    after = {r: replica_counts(port) for r, port in admin.items()}
    for r in admin:
        served = [t for s in sessions for t in s.turns if t[2] == r]
        boosted = sum(t[3] in BOOSTED for t in served)
        got = (after[r][0] - before[r][0], after[r][1] - before[r][1])
        c.check(got == (boosted, len(served)),
                f"both: {r}'s /metrics agree with the headers: boosted+forced / all admissions "
                f"{got[0]:.0f} / {got[1]:.0f}, headers {boosted} / {len(served)}")
    same_engine = sum(1 for s in sessions for a, b in zip(s.turns, s.turns[1:]) if a[4] == b[4])
    print(f"info both: {same_engine} of {len(follow)} follow-ups on their predecessor's engine "
          "(session-affinity)")

    # --- remove r1 while traffic runs ---
    def stop_r1():
        print(f"info remove: SIGTERM to r1 (pid {args.r1_pid})")
        subprocess.run(["kill", "-TERM", str(args.r1_pid)], check=False)

    marks = {s.sid: len(s.turns) for s in sessions}
    drive(sessions, args.haproxy_port, "remove", args.turns, args, during=stop_r1)
    deadline = time.monotonic() + 5
    while haproxy_state(args.stats_port).get("r1", "").startswith("UP") and time.monotonic() < deadline:
        time.sleep(0.1)
    state = haproxy_state(args.stats_port)
    c.check(not state.get("r1", "").startswith("UP"), f"remove: HAProxy marked r1 down ({state})")
    phase = [t for s in sessions for t in s.turns[marks[s.sid]:]]
    c.check(all(t[1] == 200 and t[5] is None for t in phase),
            f"remove: {len(phase)} turns, all 200 "
            f"({[t for t in phase if t[1] != 200 or t[5]][:3]} ...)")
    moved_ok = stayed_ok = moved = 0
    for s in sessions:
        seq = s.turns[marks[s.sid] - 1:]  # from the last turn of the phase before
        if home[s.sid] == "r2":
            stayed_ok += all(t[2] == "r2" and t[3] in BOOSTED for t in seq[1:])
            continue
        # r1's session: r1 ... r1 then r2 ... r2; the first turn on r2 normal, then boosted.
        names = [t[2] for t in seq]
        switch = names.index("r2") if "r2" in names else None
        if switch is None:
            continue
        moved += 1
        on_r2 = seq[switch:]
        moved_ok += (all(n == "r1" for n in names[:switch]) and all(n == "r2" for n in names[switch:])
                     and on_r2[0][3] == "normal" and all(t[3] in BOOSTED for t in on_r2[1:]))
    c.check(stayed_ok == spread["r2"], f"remove: r2's sessions stayed on r2, boosted "
            f"({stayed_ok} of {spread['r2']})")
    c.check(moved == spread["r1"], f"remove: r1's sessions moved to r2 ({moved} of {spread['r1']})")
    c.check(moved_ok == moved, f"remove: each moved session lost its boost exactly once, on its "
            f"first turn on r2 ({moved_ok} of {moved})")

    # --- add r1 back ---
    out = subprocess.run(args.r1_start, shell=True, capture_output=True, text=True, check=False)
    print(f"info readd: r1 started again (pid {out.stdout.strip()})")
    c.check(wait_up(args.r1_port, "/healthz"), "readd: r1 answers /healthz")
    deadline = time.monotonic() + 5
    while not haproxy_state(args.stats_port).get("r1", "").startswith("UP") and time.monotonic() < deadline:
        time.sleep(0.1)
    state = haproxy_state(args.stats_port)
    c.check(state.get("r1", "").startswith("UP"), f"readd: HAProxy marked r1 up ({state})")
    marks = {s.sid: len(s.turns) for s in sessions}
    drive(sessions, args.haproxy_port, "readd", args.turns, args)
    phase = [t for s in sessions for t in s.turns[marks[s.sid]:]]
    c.check(all(t[1] == 200 and t[5] is None for t in phase), f"readd: {len(phase)} turns, all 200")
    back_ok = stayed_ok = 0
    for s in sessions:
        seq = s.turns[marks[s.sid]:]
        if home[s.sid] == "r1":
            back_ok += (all(t[2] == "r1" for t in seq) and seq[0][3] == "normal"
                        and all(t[3] in BOOSTED for t in seq[1:]))
        else:
            stayed_ok += all(t[2] == "r2" and t[3] in BOOSTED for t in seq)
    c.check(back_ok == spread["r1"], f"readd: exactly the sessions that hash to r1 came back, "
            f"losing their boost once ({back_ok} of {spread['r1']})")
    c.check(stayed_ok == spread["r2"], f"readd: r2's sessions did not move ({stayed_ok} of {spread['r2']})")

    print(f"{c.failed} failed" if c.failed else "all checks passed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
