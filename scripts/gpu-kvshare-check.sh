#!/usr/bin/env bash
# Cross-server snapshot sharing with the GPU backend (issue 13 item 6), end to end:
# starts redis-server and two `flashseek serve --gpus N` processes (A, B) on one tiny checkpoint
# sharing the registry, then
#   turn 1 -> A, turn 2 (= turn 1 + answer + more) -> A: must report cached_tokens > 0 (A's own
#   snapshot of a GPU state); turn 3 (= turn 2 + answer + more) -> B: must report
#   cached_tokens > 0 (A's snapshot fetched over the snapshot transport and imported by B).
# Prints the numbers; exits non-zero on any failure. Both servers may share one GPU. Requests carry
# one API key of one tenant (a server without keys isolates every request: no reuse to check).
#
# usage: scripts/gpu-kvshare-check.sh REDIS_SERVER [options]
#   REDIS_SERVER      path to a redis-server binary
#   --build DIR       build directory holding bin/flashseek (default: build-cuda, else build)
#   --gpus N          device(s) for both servers (default 0; a list is tensor-parallel: 0,1 over
#                     NCCL, 0,0 host-staged ranks on GPU 0)
#   --cpu             run the same flow on the CPU backend (no --gpus; checks the script itself)
#   --ckpt DIR        checkpoint to serve (default: a make-tiny tiny-v41 written to a temp dir)
#   --transport T     snapshot transport: tcp (default) or ucx (UCX_TLS defaults to tcp)
#   --prompt N        turn-1 prompt tokens (default 300)
#   --answer N        tokens generated per turn (default 8)
#   --serve-args "A"  extra arguments for both servers (word-split), e.g. the dummy real-width model:
#                     "--load-format dummy --config C --num-layers 8 --gpu-memory-utilization 0.45"
#                     (with --load-format, no checkpoint is made or passed)
#   --keep            keep the temp dir (server logs) after the run
# Each turn's request time is printed. A second tenant's key (the state cache is per tenant) then
# sends the turn-2 prompt to A, and a third tenant the turn-3 prompt to B: the same requests with nothing to
# reuse (recompute), for the turn-2 / turn-3 time with a local / remote snapshot vs without.
set -u
die() { echo "gpu-kvshare-check: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: $0 REDIS_SERVER [--build DIR] [--gpus N | --cpu] [--ckpt DIR] [--transport tcp|ucx] [--prompt N] [--keep]"
REDIS=$1; shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD="" GPUS=0 CPU=0 CKPT="" TRANSPORT=tcp NPROMPT=300 KEEP=0 NANS=8 SERVE_ARGS=""
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=${2:?}; shift 2 ;;
    --gpus) GPUS=${2:?}; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --ckpt) CKPT=${2:?}; shift 2 ;;
    --transport) TRANSPORT=${2:?}; shift 2 ;;
    --prompt) NPROMPT=${2:?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --answer) NANS=${2:?}; shift 2 ;;
    --serve-args) SERVE_ARGS=${2:?}; shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
[ -x "$REDIS" ] || die "redis-server not executable: $REDIS"
if [ -z "$BUILD" ]; then
  if [ -x "$ROOT/build-cuda/bin/flashseek" ]; then BUILD=$ROOT/build-cuda; else BUILD=$ROOT/build; fi
fi
FS=$BUILD/bin/flashseek
[ -x "$FS" ] || die "no flashseek binary at $FS"
command -v python3 >/dev/null || die "python3 is needed (HTTP requests and JSON)"
case $TRANSPORT in tcp|ucx) ;; *) die "--transport tcp|ucx" ;; esac
case $NPROMPT in ''|*[!0-9]*) die "--prompt N: a number" ;; esac
case $NANS in ''|*[!0-9]*|0) die "--answer N: a positive number" ;; esac
read -r -a EXTRA <<<"$SERVE_ARGS"
DUMMY=0
case " $SERVE_ARGS " in *" --load-format "*) DUMMY=1 ;; esac

TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  if [ "$KEEP" = 1 ]; then echo "logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
export UCX_TLS=${UCX_TLS:-tcp}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

SRC=(--ckpt "$CKPT")
if [ "$DUMMY" = 1 ]; then
  SRC=()
elif [ -z "$CKPT" ]; then
  CKPT=$TMP/tiny
  "$FS" make-tiny --config tiny-v41 --seed 1 --out "$CKPT" >"$TMP/make-tiny.log" 2>&1 || { cat "$TMP/make-tiny.log"; die "make-tiny failed"; }
  SRC=(--ckpt "$CKPT")
fi

RPORT=$(free_port)
"$REDIS" --port "$RPORT" --bind 127.0.0.1 --save "" --appendonly no >"$TMP/redis.log" 2>&1 &
PIDS+=($!)

BACKEND=(--gpus "$GPUS"); KIND="GPU $GPUS"
[ "$CPU" = 1 ] && { BACKEND=(); KIND="CPU"; }

# serve NAME: starts a server, waits (deadline 300 s) until /readyz answers 200, sets PORT.
serve() {
  local name=$1 log=$TMP/$1.log port="" i
  FLASHSEEK_API_KEYS="gpu-kvshare-check-key team,gpu-kvshare-check-key2 other,gpu-kvshare-check-key3 third" "$FS" serve "${SRC[@]}" "${EXTRA[@]}" \
    "${BACKEND[@]}" --port 0 --max-context 16384 \
    --redis "redis://127.0.0.1:$RPORT" --cluster-secret gpu-kvshare-check --server-id "$name" \
    --kv-transport "$TRANSPORT" --drain-snapshots 0 >"$log" 2>&1 &
  PIDS+=($!)
  for i in $(seq 3000); do
    port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$log" | head -1)
    if [ -n "$port" ] && python3 - "$port" <<'PY' 2>/dev/null; then PORT=$port; return 0; fi
import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=2).status == 200 else 1)
PY
    kill -0 "${PIDS[-1]}" 2>/dev/null || { cat "$log" >&2; die "server $name exited"; }
    sleep 0.1
  done
  cat "$log" >&2
  die "server $name not ready within 300 s"
}

# req PORT PROMPT_JSON N [KEY]: greedy completion of N tokens; prints "cached_tokens [answer ids]
# seconds" (the request's wall time).
req() {
  python3 - "$@" <<'PY'
import json, sys, time, urllib.request
port, prompt, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
key = sys.argv[4] if len(sys.argv) > 4 else "gpu-kvshare-check-key"
body = json.dumps({"model": "deepseek-v4.1-flash", "prompt": prompt, "max_tokens": n, "temperature": 0,
                   "ignore_eos": True, "return_token_ids": True}).encode()
r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                           {"Content-Type": "application/json", "Authorization": "Bearer " + key})
t0 = time.monotonic()
j = json.loads(urllib.request.urlopen(r, timeout=600).read())
dt = time.monotonic() - t0
print(j["usage"]["prompt_tokens_details"]["cached_tokens"], json.dumps(j["choices"][0]["token_ids"], separators=(",", ":")),
      f"{dt:.3f}")
PY
}

# metric PORT NAME: value of an unlabelled Prometheus sample (0 if absent).
metric() {
  python3 - "$1" "$2" <<'PY'
import re, sys, urllib.request
m = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
v = re.search(rf"^{re.escape(sys.argv[2])} (\S+)$", m, re.M)
print(int(float(v.group(1))) if v else 0)
PY
}

# extend PROMPT_JSON ANSWER_JSON N SEED: prompt + answer + N pseudo-random ids in [10, 200).
extend() {
  python3 -c 'import json, random, sys
p, a, n, s = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = random.Random(s); print(json.dumps(p + a + [r.randrange(10, 200) for _ in range(n)]))' "$@"
}

echo "gpu-kvshare-check: backend $KIND, model ${SRC[*]:-}${SERVE_ARGS:+ $SERVE_ARGS}, transport $TRANSPORT, UCX_TLS=$UCX_TLS"
serve A; A=$PORT
serve B; B=$PORT
echo "servers: A on port $A, B on port $B, redis on $RPORT"

FAIL=0
P1=$(extend '[]' '[]' "$NPROMPT" 1)
read -r C1 ANS1 T1 < <(req "$A" "$P1" "$NANS") || die "turn 1 failed"
echo "turn 1 -> A: prompt $NPROMPT tokens, $NANS generated, ${T1} s"
P2=$(extend "$P1" "$ANS1" 40 2)
read -r C2 ANS2 T2 < <(req "$A" "$P2" "$NANS") || die "turn 2 failed"
N2=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$P2")
echo "turn 2 -> A: prompt $N2 tokens, cached_tokens $C2, ${T2} s"
[ "$C2" -gt 0 ] || { echo "FAIL: turn 2 on A reused nothing from turn 1" >&2; FAIL=1; }

# B learns of A's snapshots through the registry's event channel (asynchronous): wait until it
# has seen as many as A stored (deadline 30 s), then send turn 3 to B.
PUTS=$(metric "$A" flashseek_state_cache_snapshots_total)
for i in $(seq 300); do
  [ "$(metric "$B" flashseek_kvshare_remote_view_snapshots)" -ge "$PUTS" ] && break
  sleep 0.1
done
echo "A stored $PUTS snapshots; B sees $(metric "$B" flashseek_kvshare_remote_view_snapshots) of them"
P3=$(extend "$P2" "$ANS2" 30 3)
read -r C3 ANS3 T3 < <(req "$B" "$P3" "$NANS") || die "turn 3 failed"
N3=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$P3")
FETCHES=$(metric "$B" flashseek_kvshare_fetches_total)
echo "turn 3 -> B: prompt $N3 tokens, cached_tokens $C3 (B's fetches from peers: $FETCHES), ${T3} s"
# The same two requests from two other tenants (one each: a tenant's turn-2 snapshot would serve
# its turn 3): nothing to reuse (the recompute baseline).
read -r R2 _ RT2 < <(req "$A" "$P2" "$NANS" gpu-kvshare-check-key2) || die "turn 2 recompute failed"
read -r R3 _ RT3 < <(req "$B" "$P3" "$NANS" gpu-kvshare-check-key3) || die "turn 3 recompute failed"
echo "recompute (other tenants): turn 2 -> A cached_tokens $R2, ${RT2} s; turn 3 -> B cached_tokens $R3, ${RT3} s"
if [ "$R2" != 0 ] || [ "$R3" != 0 ]; then echo "FAIL: another tenant's request reused a snapshot" >&2; FAIL=1; fi
[ "$C3" -gt 0 ] || { echo "FAIL: turn 3 on B reused nothing of A's snapshots" >&2; FAIL=1; }
for s in A B; do grep -h "snapshot not stored\|snapshots skipped\|not restored" "$TMP/$s.log" | sed "s/^/[$s] /" | head -5; done
if [ "$FAIL" = 0 ]; then echo "gpu-kvshare-check: OK"; else echo "gpu-kvshare-check: FAILED (logs: rerun with --keep)"; fi
exit "$FAIL"
