#!/usr/bin/env python3
"""Turn-2 time to first token on the tiny model: local hit, remote hit (fetched from a peer
through Redis + the snapshot transport, over UCX and over TCP) and recompute (no cache), plus
the transfer rate, then `flashseek kv-bench` (UCX vs TCP throughput for 1..64 MiB blobs).

usage: scripts/bench_kvshare.py BUILD_DIR [PROMPT_TOKENS]
Starts its own redis-server and `flashseek serve` processes on loopback; UCX_TLS defaults to tcp."""
import json, os, random, re, signal, socket, subprocess, sys, tempfile, time, urllib.request

build, n_prompt = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1500
fs = os.path.join(build, "bin", "flashseek")
tmp = tempfile.mkdtemp()
os.environ.setdefault("UCX_TLS", "tcp")
procs = []

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def post(port, prompt, n):
    body = json.dumps({"model": "deepseek-v4.1-flash", "prompt": prompt, "max_tokens": n,
                       "temperature": 0, "ignore_eos": True, "return_token_ids": True}).encode()
    t0 = time.time()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    j = json.loads(urllib.request.urlopen(req, timeout=600).read())
    return time.time() - t0, j["choices"][0]["token_ids"], j["usage"]["prompt_tokens_details"]["cached_tokens"]

def serve(name, extra):
    log = open(os.path.join(tmp, name + ".log"), "w+")
    p = subprocess.Popen([fs, "serve", "--ckpt", ckpt, "--port", "0", "--max-context", "16384"] + extra,
                         stdout=log, stderr=subprocess.STDOUT)
    procs.append(p)
    for _ in range(600):
        log.seek(0); m = re.search(r"listening on http://[^:]+:(\d+)", log.read())
        if m: break
        time.sleep(0.05)
    port = int(m.group(1))
    for _ in range(600):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status == 200: return port
        except Exception: time.sleep(0.05)
    raise SystemExit(name + " not ready")

try:
    ckpt = os.path.join(tmp, "tiny")
    subprocess.run([fs, "make-tiny", "--config", "tiny-v41", "--seed", "1", "--out", ckpt], check=True,
                   capture_output=True)
    rport = free_port()
    procs.append(subprocess.Popen(["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL))
    time.sleep(0.5)
    common = ["--redis", f"redis://127.0.0.1:{rport}", "--cluster-secret", "bench",
              "--shared-cache"]  # no API keys here: opt in to reuse across requests
    a = serve("A", common + ["--server-id", "A"])
    plain = serve("C", ["--host-cache-bytes", "0"])
    rnd = random.Random(1)
    print(f"turn 2 time to first token on tiny-v41 (CPU), UCX_TLS={os.environ['UCX_TLS']}:")
    for transport in ["ucx", "tcp"]:
        b = serve("B" + transport, common + ["--server-id", "B" + transport, "--kv-transport", transport])
        p1 = [rnd.randrange(10, 200) for _ in range(n_prompt)]
        _, ans, _ = post(a, p1, 4)
        p2 = p1 + ans + [rnd.randrange(10, 200) for _ in range(20)]
        time.sleep(2.0)  # let A's announcement reach Redis (and B's heartbeat)
        t_remote, tok_r, cached_r = post(b, p2, 1)
        t_recompute, tok_c, _ = post(plain, p2, 1)
        p3 = p2 + tok_r + [7, 8, 9]
        t_local, _, cached_l = post(b, p3, 1)
        m = urllib.request.urlopen(f"http://127.0.0.1:{b}/metrics").read().decode()
        rb = float(re.search(rf'^flashseek_kvshare_transfer_bytes_total{{transport="{transport}"}} (\S+)', m, re.M).group(1))
        rs = float(re.search(rf'^flashseek_kvshare_transfer_seconds_total{{transport="{transport}"}} (\S+)', m, re.M).group(1))
        print(f" [{transport}] prompt {len(p2)} tokens:")
        print(f"  remote hit : {t_remote*1000:8.1f} ms  (cached_tokens {cached_r}, same answer: {tok_r == tok_c})")
        print(f"  recompute  : {t_recompute*1000:8.1f} ms")
        print(f"  local hit  : {t_local*1000:8.1f} ms  (cached_tokens {cached_l})")
        print(f"  transfer   : {rb/1e6:.2f} MB in {rs*1000:.1f} ms = {rb/max(rs,1e-9)/1e9:.2f} GB/s (control + data)")
    print(flush=True)
    subprocess.run([fs, "kv-bench", "--repeat", "5"], check=True)
finally:
    for p in procs: p.send_signal(signal.SIGKILL)
