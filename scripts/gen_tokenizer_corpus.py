#!/usr/bin/env python3
"""Builds the tokenizer parity corpus: tests/tokenizer/corpus/corpus.jsonl (one JSON string,
i.e. one document, per line; ~1.2 MB of text).

Deterministic: a fixed seed, text written here, and a fixed list of this repository's own files
(their content at generation time; regenerating after they change gives a different, equally
valid corpus). Mixes English prose, code, CJK (Chinese, Japanese, Korean), emoji sequences,
digits, whitespace runs (spaces, tabs, LF, CR, CRLF, Unicode spaces), other scripts with
combining marks, and V4.1 added-token strings (whole, partial, adjacent, nested).

Usage: scripts/gen_tokenizer_corpus.py [--out PATH]
"""
import argparse
import json
import os
import random

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 20240601

REPO_FILES = [
    "CMakeLists.txt", "cmake/Targets.cmake", "cmake/Flags.cmake", "cmake/Deps.cmake",
    "cmake/Cuda.cmake", "src/core/status.h", "src/core/numeric.h", "src/core/thread_pool.h",
    "src/core/thread_pool.cpp", "src/core/rng.h", "src/core/dtype.h", "src/model/config.h",
    "src/forward/model.h", "tools/command.h", "tools/main.cpp", "tests/core/numeric_test.cpp",
    "scripts/gen_v41_added_tokens.py", "scripts/fetch_tokenizer.sh",
    "src/tokenizer/bpe.cpp", "src/tokenizer/pretokenize.cpp", "src/tokenizer/tokenizer_utf8.cpp",
    "docs/tokenizer.md",
]

WORDS = ("the of and to in is was for on that with as by at from it this be are or an which "
         "model token layer attention expert cache prefix server request stream batch decode "
         "prefill kernel memory sparse dense router gate weight scale quantized latency "
         "throughput engine shard pipeline vector matrix tensor softmax logits sample temperature "
         "don't it's we'll they're you've I'm isn't O'Neil rock'n'roll naïve café résumé "
         "coöperate façade jalapeño Zürich São Paulo Kraków").split()
ZH = ["你好", "推理", "答案", "我们今天讨论大语言模型的推理效率。", "这个问题的答案是四十二。",
      "深度学习模型需要大量的计算资源和数据。", "请用中文回答下面的问题：", "毕老师！",
      "北京是中华人民共和国的首都，人口超过两千万。", "混合专家模型在每个词元只激活少数专家。",
      "注意力机制的复杂度与序列长度成平方关系", "他说：“明天见。”然后就走了……",
      "数字１２３和全角字母ＡＢＣ", "龥龜龘齉", "鿿鿕", "〇一二三四五六七八九十百千万亿"]
JA = ["こんにちは、世界！", "カタカナのテキストとひらがなのテキスト。", "東京は日本の首都です。",
      "ｶﾀｶﾅ半角", "ー・ヽヾゝゞ", "ゟ゠ヿ"]
KO = ["안녕하세요 세계", "한국어 텍스트 토크나이저 테스트입니다.", "ㄱㄴㄷ ㅏㅑㅓ"]
OTHER = ["Привет, мир! Съешь же ещё этих мягких французских булок.", "Γειά σου Κόσμε αβγδ ΑΒΓΔ",
         "مرحبا بالعالم، هذا نصّ عربيّ مُشَكَّل.", "नमस्ते दुनिया, यह हिन्दी पाठ है।",
         "สวัสดีชาวโลก ภาษาไทย", "שלום עולם", "e\u0301 a\u0308 o\u0302\u0323 n\u0303",
         "Ǆ ǅ ǆ ﬁ ﬂ ß ẞ İ ı", "∑ ∫ √ ∞ ≤ ≥ ≠ ± × ÷ → ⇒ ∀ ∃ ∈ ∉", "┌─┐│└─┘ ░▒▓█",
         "€ £ ¥ ₹ ₿ $ ¢", "© ® ™ § ¶ † ‡ • … ‰", "\u00ad soft\u00adhyphen", "ǰ̣ ḱ̇"]
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👩\u200d💻", "👩\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈",
         "🇯🇵", "🇺🇸", "🇩🇪", "1️⃣", "#️⃣", "❤️", "❤", "✨", "🚀", "🤖", "🧠", "💡", "🔥",
         "☕", "🎉", "🙏🏿", "🫠", "👨\u200d🚀", "⚡", "✅", "❌", "🐍"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2028", "\u2029",
          "\u0085", "\u000b", "\u000c", "\u2003", "\u202f", "\u200b", "\ufeff", "\u1680"]
PUNCT = list(".,;:!?-()[]{}'\"/\\@#$%^&*_+=<>|~`") + ["...", "--", "—", "–", "«", "»", "¿", "¡"]


def load_added_tokens():
    with open(os.path.join(REPO, "data/tokenizer/v41_added_tokens.json"), encoding="utf-8") as f:
        return [t["content"] for t in json.load(f)["added_tokens"]]


def english(rng, n_words):
    out = []
    for i in range(n_words):
        w = rng.choice(WORDS)
        if i == 0 or out[-1].endswith((".", "!", "?")):
            w = w.capitalize()
        out.append(w)
        r = rng.random()
        if r < 0.08:
            out[-1] += rng.choice([",", ".", ";", ":", "!", "?", "'s", ")"])
        elif r < 0.1:
            out.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
    return " ".join(out) + "."


def numbers(rng):
    forms = [
        lambda: str(rng.randint(0, 10 ** rng.randint(1, 30))),
        lambda: f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 9)}f}",
        lambda: f"{rng.random():e}",
        lambda: f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        lambda: f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
        lambda: f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}",
        lambda: "abc" + str(rng.randint(0, 99999)) + "def" + str(rng.randint(0, 9)),
        lambda: "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 50))),
        lambda: rng.choice(["١٢٣٤٥", "۱۲۳", "१२३४", "²³¹", "½¼¾", "Ⅻ Ⅳ ⅸ", "①②③", "０１２３４５"]),
        lambda: f"0x{rng.getrandbits(64):X}",
    ]
    return " ".join(rng.choice(forms)() for _ in range(rng.randint(3, 15)))


def whitespace(rng):
    parts = []
    for _ in range(rng.randint(5, 30)):
        r = rng.random()
        if r < 0.5:
            parts.append("".join(rng.choice(SPACES) for _ in range(rng.randint(1, 12))))
        elif r < 0.6:
            parts.append(" " * rng.randint(1, 70))
        else:
            parts.append(rng.choice(WORDS + PUNCT + ZH[:3] + EMOJI[:5]))
    return "".join(parts)


def cjk(rng):
    parts = []
    for _ in range(rng.randint(3, 12)):
        r = rng.random()
        if r < 0.4:
            parts.append(rng.choice(ZH))
        elif r < 0.55:
            parts.append(rng.choice(JA))
        elif r < 0.65:
            parts.append(rng.choice(KO))
        elif r < 0.85:  # random hanzi of the split block, including rare ones
            parts.append("".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(rng.randint(1, 40))))
        else:
            parts.append(rng.choice(["，", "。", "！", "？", "、", "「", "」", "：", " ", "\n", "123", "AI"]))
    return "".join(parts)


def mixed(rng, added):
    pools = [lambda: english(rng, rng.randint(3, 20)), lambda: cjk(rng),
             lambda: rng.choice(EMOJI) * rng.randint(1, 3), lambda: numbers(rng),
             lambda: rng.choice(OTHER), lambda: rng.choice(SPACES) * rng.randint(1, 4),
             lambda: rng.choice(PUNCT) * rng.randint(1, 5), lambda: rng.choice(added),
             lambda: rng.choice(added)[: rng.randint(1, 8)],
             lambda: "".join(chr(rng.randint(0x20, 0x7E)) for _ in range(rng.randint(1, 30)))]
    return "".join(rng.choice(pools)() for _ in range(rng.randint(5, 40)))


def special_tokens_doc(rng, added):
    named = [t for t in added if "place" not in t]
    parts = []
    for _ in range(rng.randint(5, 25)):
        t = rng.choice(named if rng.random() < 0.7 else added)
        r = rng.random()
        if r < 0.3:
            parts.append(t)
        elif r < 0.45:
            parts.append(t + t)
        elif r < 0.6:
            parts.append(t[:-1])  # partial: must fall back to BPE
        elif r < 0.7:
            parts.append("<" + t + ">")
        elif r < 0.8:
            parts.append("<|place_holder_mm_span_" + f"{rng.randint(0, 9999):04d}" + "|>")
        else:
            parts.append(rng.choice([" ", "\n", "x", "你好", "😀", "123"]) + t)
    return "".join(parts)


def chat_doc(rng):
    effort = "Reasoning Effort: 50 (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
    p = "<｜begin▁of▁sentence｜><｜System｜>" + effort + english(rng, 12) + "<｜User｜>" + cjk(rng)
    p += "<｜Assistant｜><think>" + english(rng, 20) + "</think>" + english(rng, 15)
    p += '\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="get_weather">\n'
    p += '<｜DSML｜ parameter name="city" string="true">北京</｜DSML｜ parameter>\n'
    p += '<｜DSML｜ parameter name="days" string="false">3</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n'
    p += "</｜DSML｜ calls><｜end▁of▁sentence｜><｜User｜><tool_result>{\"temp\": 21.5}</tool_result>"
    return p + "<｜Assistant｜></think>"


def code_docs():
    docs = []
    for rel in REPO_FILES:
        path = os.path.join(REPO, rel)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        lines = text.splitlines(keepends=True)
        chunk = ""
        for line in lines:
            chunk += line
            if len(chunk) > 6000:
                docs.append(chunk)
                chunk = ""
        if chunk:
            docs.append(chunk)
    # CRLF variants of some code, as from Windows editors.
    docs += [d.replace("\n", "\r\n") for d in docs[::4]]
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests/tokenizer/corpus/corpus.jsonl"))
    args = ap.parse_args()
    rng = random.Random(SEED)
    added = load_added_tokens()
    docs = code_docs()
    makers = [(0.18, lambda: english(rng, rng.randint(20, 400))),
              (0.14, lambda: cjk(rng)), (0.08, lambda: numbers(rng)),
              (0.10, lambda: whitespace(rng)), (0.22, lambda: mixed(rng, added)),
              (0.10, lambda: special_tokens_doc(rng, added)), (0.05, lambda: chat_doc(rng)),
              (0.05, lambda: " ".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 40)))),
              (0.08, lambda: " ".join(rng.choice(OTHER) for _ in range(rng.randint(1, 10))))]
    weights = [w for w, _ in makers]
    target = 1_200_000
    total = sum(len(d.encode()) for d in docs)
    while total < target:
        doc = rng.choices([m for _, m in makers], weights)[0]()
        docs.append(doc)
        total += len(doc.encode())
    rng.shuffle(docs)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {len(docs)} documents, {total} bytes of text")


if __name__ == "__main__":
    main()
