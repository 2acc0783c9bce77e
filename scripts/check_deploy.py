#!/usr/bin/env python3
"""Checks deploy/kubernetes.yaml: it parses, and it keeps the defences docs/security.md lists.

- the server requires API keys from a file mounted from a Secret (--api-key-file);
- the cluster secret and the Redis password come from a Secret (secretKeyRef), never a literal;
- Redis runs with requirepass and the server's Redis URL carries the password;
- NetworkPolicies: Redis only from the replicas; snapshot ports (7000-7008) only between replicas.
Usage: scripts/check_deploy.py [deploy/kubernetes.yaml]. Exit 1 with one line per problem.
"""
import sys

import yaml

path = sys.argv[1] if len(sys.argv) > 1 else "deploy/kubernetes.yaml"
with open(path, encoding="utf-8") as f:
    docs = [d for d in yaml.safe_load_all(f) if d]
problems = []


def need(cond, what):
    if not cond:
        problems.append(what)


def one(kind, name):
    found = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    need(len(found) == 1, f"exactly one {kind} {name}")
    return found[0] if found else {}


def container(workload):
    return workload.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]


def env(c):
    return {e["name"]: e for e in c.get("env", [])}


def from_secret(e):
    return e is not None and "secretKeyRef" in e.get("valueFrom", {})


# No literal value for anything secret-like anywhere.
for d in docs:
    for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        for e in c.get("env", []):
            if any(w in e["name"] for w in ("SECRET", "PASSWORD", "API_KEY")):
                need(from_secret(e), f"{c['name']}: env {e['name']} comes from a Secret")

server = container(one("StatefulSet", "flashseek"))
cmd = " ".join(server.get("command", []) + server.get("args", []))
need("--api-key-file /etc/flashseek/api-keys" in cmd, "serve reads --api-key-file /etc/flashseek/api-keys")
need("--api-key " not in cmd and "--cluster-secret" not in cmd, "no key or secret on the command line")
pod = one("StatefulSet", "flashseek").get("spec", {}).get("template", {}).get("spec", {})
mounts = {m["name"]: m for m in server.get("volumeMounts", [])}
vols = {v["name"]: v for v in pod.get("volumes", [])}
key_mount = [n for n, m in mounts.items() if m["mountPath"] == "/etc/flashseek"]
need(key_mount and "secret" in vols.get(key_mount[0], {}), "/etc/flashseek is a Secret volume")
se = env(server)
need(from_secret(se.get("FLASHSEEK_CLUSTER_SECRET")), "cluster secret from a Secret")
need(from_secret(se.get("REDIS_PASSWORD")), "server's Redis password from a Secret")
need(se.get("FLASHSEEK_REDIS_URL", {}).get("value", "").startswith("redis://:$(REDIS_PASSWORD)@"),
     "server's Redis URL carries the password")

redis = container(one("Deployment", "flashseek-redis"))
need("requirepass $REDIS_PASSWORD" in " ".join(redis.get("args", [])), "redis-server gets requirepass")
need(from_secret(env(redis).get("REDIS_PASSWORD")), "Redis password from a Secret")

replicas = {"podSelector": {"matchLabels": {"app": "flashseek"}}}
rp = one("NetworkPolicy", "flashseek-redis").get("spec", {})
need(rp.get("podSelector") == {"matchLabels": {"app": "flashseek-redis"}}, "Redis policy selects Redis")
need("Ingress" in rp.get("policyTypes", []), "Redis policy restricts ingress")
need(all(r.get("from") == [replicas] for r in rp.get("ingress", [])) and rp.get("ingress"),
     "Redis reachable from the replicas only")
fp = one("NetworkPolicy", "flashseek").get("spec", {})
need("Ingress" in fp.get("policyTypes", []), "replica policy restricts ingress")
for rule in fp.get("ingress", []):
    ports = {p["port"] for p in rule.get("ports", [])}
    if ports != {8000}:  # anything but the HTTP port: replicas only
        need(rule.get("from") == [replicas], f"ports {sorted(ports)} reachable from the replicas only")
    if not rule.get("ports"):
        need(False, "every ingress rule names its ports")

for p in problems:
    print(f"{path}: missing: {p}")
print(f"{path}: {len(docs)} documents, " + ("ok" if not problems else f"{len(problems)} problems"))
sys.exit(1 if problems else 0)
