#!/usr/bin/env python3
"""Concurrent streaming load on a flashseek (or any OpenAI-compatible) server.

Python standard library only. Runs --streams chat completions at once (each with its own prompt,
so no two share a cached prefix), every one streaming --max-tokens tokens (ignore_eos), and prints
one line per run: streams, tokens, wall time, aggregate tok/s (all tokens / wall time), mean
per-stream decode tok/s (tokens after the first / time after the first) and median time to first
token. Several --streams values run one after the other.

  python3 scripts/serve_load.py --url http://127.0.0.1:8000 --streams 1,8,32 --max-tokens 64
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request


def one_stream(url, api_key, model, prompt, max_tokens, out, i):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
        "thinking": {"type": "disabled"},
    }
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), headers=headers)
    t0 = time.monotonic()
    first = None
    tokens = 0
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if ev.get("usage"):
                    tokens = ev["usage"].get("completion_tokens", tokens)
                for ch in ev.get("choices") or []:
                    delta = ch.get("delta") or {}
                    if (delta.get("content") or delta.get("reasoning_content")) and first is None:
                        first = time.monotonic()
    except urllib.error.HTTPError as e:
        out[i] = {"error": f"{e}: {e.read()[:300].decode('utf-8', 'replace')}"}
        return
    except Exception as e:  # noqa: BLE001 - reported per stream
        out[i] = {"error": str(e)}
        return
    t1 = time.monotonic()
    out[i] = {"tokens": tokens, "ttft": (first or t1) - t0, "decode_s": t1 - (first or t1), "t0": t0, "t1": t1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="deepseek-v4.1-flash")
    ap.add_argument("--streams", default="1,8,32", help="comma-separated concurrency levels")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--api-key", default=os.environ.get("FLASHSEEK_API_KEY", ""))
    args = ap.parse_args()
    for n in [int(x) for x in args.streams.split(",") if x]:
        out = [None] * n
        threads = [
            threading.Thread(target=one_stream,
                             args=(args.url, args.api_key, args.model,
                                   f"Stream {i} of {n}: write a long story about the number {i * 7919 % 1000}.",
                                   args.max_tokens, out, i))
            for i in range(n)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        errs = [o["error"] for o in out if o is None or "error" in o]
        ok = [o for o in out if o and "error" not in o]
        total = sum(o["tokens"] for o in ok)
        per = [(o["tokens"] - 1) / o["decode_s"] for o in ok if o["decode_s"] > 0 and o["tokens"] > 1]
        ttft = statistics.median(o["ttft"] for o in ok) if ok else float("nan")
        print(f"streams {n}: {total} tokens in {wall:.2f} s, aggregate {total / wall:.1f} tok/s, "
              f"per stream {statistics.mean(per) if per else float('nan'):.1f} tok/s, "
              f"median TTFT {ttft:.3f} s, errors {len(errs)}" + (f" (first: {errs[0]})" if errs else ""),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
