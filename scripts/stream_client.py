#!/usr/bin/env python3
"""Streams one chat completion from a flashseek (or any OpenAI-compatible) server.

Python standard library only. Sends "thinking": {"type": "disabled"} and
stream_options.include_usage, prints the content as it arrives and ends with
"N tokens at X tokens/s (first token after Y s)".

  python3 scripts/stream_client.py --url http://127.0.0.1:8000 --max-tokens 512
"""
import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

DEFAULT_PROMPT = "implement the tetris game. output HTML code directly - no explanation."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    ap.add_argument("--model", default="deepseek-v4.1-flash")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--api-key", default=os.environ.get("FLASHSEEK_API_KEY", ""))
    args = ap.parse_args()

    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": args.prompt}],
        "max_tokens": args.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "thinking": {"type": "disabled"},
    }
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    req = urllib.request.Request(args.url.rstrip("/") + "/v1/chat/completions",
                                 data=json.dumps(body).encode(), headers=headers)
    start = time.monotonic()
    first = None
    chunks = 0
    usage = None
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            for raw in resp:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data: {"):
                    continue  # blank separators, comments, "data: [DONE]"
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    print("\nserver error: " + event["error"].get("message", ""), file=sys.stderr)
                    return 1
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices", []):
                    delta = choice.get("delta", {})
                    text = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
                    if text:
                        if first is None:
                            first = time.monotonic()
                        chunks += 1
                        sys.stdout.write(text)
                        sys.stdout.flush()
    except urllib.error.HTTPError as e:
        print(f"HTTP {e.code}: {e.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except urllib.error.URLError as e:
        print(f"cannot reach {args.url}: {e.reason}", file=sys.stderr)
        return 1
    end = time.monotonic()
    tokens = usage["completion_tokens"] if usage else chunks
    ttft = (first or end) - start
    decode = end - (first or start)
    rate = (tokens - 1) / decode if tokens > 1 and decode > 0 else tokens / max(end - start, 1e-9)
    print(f"\n\n{tokens} tokens at {rate:.1f} tokens/s (first token after {ttft:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
