#!/usr/bin/env python3
"""Writes the config of the real-width dummy V4.1 model that the GPU measurement scripts load
(gpu-realwidth.sh, gpu-full40.sh, gpu-spec-script.sh, gpu-profile-decode.sh): the release config
(tests/model/data/v41-flash-config.json) with the Engram tables cut to ~1M rows each (the full
ones are ~100 GB of host memory each; a step reads 24 rows per token whatever the table size) and
N routed experts per layer (384 in the release; a batch-1 token reads 6 whatever N).

  python3 scripts/realwidth_config.py --experts 48 OUT.json
"""
import argparse
import json
import os


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="config.json to write")
    ap.add_argument("--experts", type=int, default=384, help="routed experts per layer")
    ap.add_argument("--config", default=os.path.join(here, "..", "tests", "model", "data", "v41-flash-config.json"))
    args = ap.parse_args()
    if args.experts < 1:
        ap.error("--experts must be >= 1")
    with open(args.config) as f:
        c = json.load(f)
    t = c["text_config"]
    t["engram_vocab_size"] = 40000  # the prime layout then gives these rows (ops::engram_layouts)
    t["engram_num_embeddings"] = [963078, 970134]
    t["n_routed_experts"] = args.experts
    t["dspark_n_routed_experts"] = min(t["dspark_n_routed_experts"], args.experts)
    with open(args.out, "w") as f:
        json.dump(c, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
