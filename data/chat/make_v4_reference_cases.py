#!/usr/bin/env python3
"""Random differential cases for the chat encoder/parser, produced by the official V4 encoder.

Usage: make_v4_reference_cases.py --encoder PATH/encoding_dsv4.py --seed N --out cases.json
(the release's `encoding/encoding_dsv4.py`; not part of this repository). Then run
  FLASHSEEK_DSV4_CASES=cases.json build/tests/test_tokenizer --gtest_also_run_disabled_tests
    --gtest_filter='ChatGoldenV4.DISABLED_RandomReferenceCases'
Encode cases: random conversations (all roles, tools, tool calls, tool results, tasks, effort,
drop_thinking) with the reference's prompt or error. Parse cases: rendered assistant turns,
some truncated or corrupted, with the reference's parse result or error.
"""
import argparse
import copy
import importlib.util
import json
import random

PIECES = ["a", "Z", " ", "\n", "\n\n", "é", "日本", "{", "}", "\"", "<", ">", "/", "x y"]
TOOL = {"type": "function", "function": {"name": "f", "description": "d é", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}}}}}


def text(n=5):
    return "".join(random.choice(PIECES) for _ in range(random.randint(0, n)))


def value(depth=0):
    r = random.randint(0, 7 if depth < 2 else 4)
    if r == 0:
        return random.randint(-100, 100)
    if r == 1:
        return random.choice([0.5, 1.0, 1e-7, 2.5e20, -3.25])
    if r == 2:
        return random.choice([True, False, None])
    if r in (3, 4):
        return text(4)
    if r == 5:
        return [value(depth + 1) for _ in range(random.randint(0, 3))]
    return {"k" + text(1): value(depth + 1) for _ in range(random.randint(0, 3))}


def tool_calls(ids):
    return [{"id": t, "type": "function", "function": {"name": "f" + text(1), "arguments": json.dumps(
        {"p%d" % j: value() for j in range(random.randint(0, 3))}, ensure_ascii=False)}} for t in ids]


def conversation():
    msgs, ids = [], []
    for _ in range(random.randint(1, 8)):
        role = random.choice(["system", "user", "user", "assistant", "assistant", "tool",
                              "developer", "latest_reminder"])
        m = {"role": role}
        if role == "assistant":
            if random.random() < 0.7:
                m["reasoning_content"] = text()
            m["content"] = text()
            if random.random() < 0.4:
                ids = ["id%d" % k for k in range(random.randint(1, 3))]
                random.shuffle(ids)
                m["tool_calls"] = tool_calls(ids)
        elif role == "tool":
            m["tool_call_id"] = random.choice(ids) if ids else "zz"
            m["content"] = text()
        else:
            m["content"] = text() if role != "developer" else "dev" + text()
            if role in ("user", "developer") and random.random() < 0.1:
                m["task"] = random.choice(["action", "query", "title"])
            if role in ("system", "developer") and random.random() < 0.3:
                m["tools"] = [TOOL]
            if role == "system" and random.random() < 0.2:
                m["response_format"] = {"type": "json_schema", "schema": {"x": value()}}
        msgs.append(m)
    return msgs


def corrupt(s):
    r = random.random()
    if r < 0.3:
        return s[:random.randint(0, len(s))]
    k = random.randint(0, len(s))
    if r < 0.5:
        return s[:k] + random.choice(["x", "\n", ">", "<", "</think>", "\n\n"]) + s[k:]
    if r < 0.6:
        return s[:k] + s[k + 1:]
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoder", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("enc", args.encoder)
    enc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enc)
    random.seed(args.seed)
    encode_cases, parse_cases = [], []
    for _ in range(args.n):
        msgs = conversation()
        case = {"messages": msgs, "mode": random.choice(["chat", "thinking"]),
                "drop_thinking": random.random() < 0.7, "effort": random.choice([None, "high", "max"])}
        try:
            case["out"] = enc.encode_messages(copy.deepcopy(msgs), thinking_mode=case["mode"],
                                              drop_thinking=case["drop_thinking"],
                                              reasoning_effort=case["effort"])
        except Exception as e:  # noqa: BLE001 - the reference signals bad input by raising
            case["error"] = repr(e)[:120]
        encode_cases.append(case)

        m = {"role": "assistant", "reasoning_content": text(), "content": text()}
        if random.random() < 0.6:
            m["tool_calls"] = tool_calls(["c%d" % k for k in range(random.randint(1, 3))])
        mode = random.choice(["chat", "thinking"])
        completion = corrupt(enc.render_message(1, [{"role": "user", "content": "q"}, m], thinking_mode=mode))
        pcase = {"text": completion, "mode": mode}
        try:
            pcase["out"] = enc.parse_message_from_completion_text(completion, thinking_mode=mode)
        except Exception as e:  # noqa: BLE001
            pcase["error"] = repr(e)[:120]
        parse_cases.append(pcase)
    with open(args.out, "w") as f:
        json.dump({"encode": encode_cases, "parse": parse_cases}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
