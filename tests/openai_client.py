#!/usr/bin/env python3
"""Talks to warmpath with the official `openai` Python client (run by tests/openai_client.rs).

Usage: python3 tests/openai_client.py BASE_URL [EXPECTED_CONTENT]

BASE_URL is the router, e.g. http://127.0.0.1:8080 (the script adds /v1). The fake backend
behind it answers every chat completion with EXPECTED_CONTENT, as one message or as SSE chunks
ending with `data: [DONE]`. Checks, through the client's own parsing:
- GET /v1/models lists the model "m";
- a non-streaming chat completion with an X-Session-ID header returns the content intact;
- a streaming one returns the same content, delta by delta, and finish_reason "stop";
- an unknown model is the router's 404 with code "model_not_found".
Prints one line per check; exits 1 with a message on the first failure, and 3 when the
`openai` package is missing (the Rust test turns that into "pip install openai").
"""

import sys

try:
    import openai
except ImportError:
    print("the openai package is not installed: pip install openai", file=sys.stderr)
    sys.exit(3)

DEFAULT_CONTENT = "Hello from the fake backend"
MODEL = "m"
SESSION = "py-session-1"
MESSAGES = [{"role": "user", "content": "Say hello."}]


def check(condition, what):
    if not condition:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    base = sys.argv[1].rstrip("/")
    expected = sys.argv[2] if len(sys.argv) == 3 else DEFAULT_CONTENT
    # No retries: a router error must show, not be papered over by the client.
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="test-key", max_retries=0, timeout=10)

    ids = [model.id for model in client.models.list().data]
    check(MODEL in ids, f"/v1/models lists {MODEL!r}: {ids}")

    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, extra_headers={"X-Session-ID": SESSION}
    )
    content = reply.choices[0].message.content
    check(content == expected, f"non-streaming content {content!r} == {expected!r}")
    check(reply.choices[0].finish_reason == "stop", "non-streaming finish_reason is stop")

    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, extra_headers={"X-Session-ID": SESSION}
    )
    pieces, finish, chunks = [], None, 0
    for chunk in stream:
        chunks += 1
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.delta.content:
            pieces.append(choice.delta.content)
        finish = choice.finish_reason or finish
    streamed = "".join(pieces)
    check(chunks >= 3, f"streamed {chunks} chunks")
    check(streamed == expected, f"streamed content {streamed!r} == {expected!r}")
    check(finish == "stop", "streamed finish_reason is stop")

    try:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
        check(False, "an unknown model is refused")
    except openai.NotFoundError as error:
        check(error.status_code == 404, "an unknown model is a 404")
        check(error.code == "model_not_found", f"its code is model_not_found: {error.code!r}")


if __name__ == "__main__":
    main()
