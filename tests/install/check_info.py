#!/usr/bin/env python3
"""Runs shoal-info (text and --json) as a user would before a job and checks
what it says against what the test set: the interface NCCL_SOCKET_IFNAME=lo
selects, a parameter's value and source, an unhonoured NCCL variable, and a
tuner table with an entry per collective and size for --ranks 8 --nodes 2.

    check_info.py SHOAL_INFO
"""
import json
import os
import subprocess
import sys

info = sys.argv[1]
env = dict(os.environ, NCCL_SOCKET_IFNAME="lo", NCCL_PROTO="LL", SHOAL_SEGMENT_BYTES="262144")
env.pop("NCCL_DEBUG", None)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


text = subprocess.run([info, "--ranks", "8", "--nodes", "2"], env=env, capture_output=True, text=True, timeout=60)
print(text.stdout)
check(text.returncode == 0, f"shoal-info exited {text.returncode}: {text.stderr}")
for needle in ("Machine", "selected: lo", "libfabric", "/dev/shm", "NCCL_PROTO=LL", "AllReduce", "between nodes: tcp"):
    check(needle in text.stdout, f"text output lacks '{needle}'")

run = subprocess.run([info, "--json", "--ranks", "8", "--nodes", "2"], env=env, capture_output=True, text=True,
                     timeout=60)
check(run.returncode == 0, f"shoal-info --json exited {run.returncode}: {run.stderr}")
doc = json.loads(run.stdout)

check(doc["build"]["nccl_version_code"] == 23007, "nccl_version_code")
check(doc["machine"]["cores"] >= 1, "machine cores")
check(doc["network"]["selected"] == "lo", f"selected interface {doc['network'].get('selected')!r}, want lo")
check(doc["network"]["NCCL_SOCKET_IFNAME"] == "lo", "NCCL_SOCKET_IFNAME echoed")
check(any(i["name"] == "lo" and i["candidate"] == 0 for i in doc["network"]["interfaces"]), "lo is candidate 0")
check("providers" in doc["libfabric"], "libfabric providers listed")
check(doc["shared_memory"]["dev_shm_bytes"] > 0, "/dev/shm size")

params = {p["name"]: p for p in doc["environment"]["parameters"]}
check(params["SHOAL_SEGMENT_BYTES"]["value"] == "262144" and params["SHOAL_SEGMENT_BYTES"]["source"] == "environment",
      "SHOAL_SEGMENT_BYTES from the environment")
check(params["SHOAL_IDLE_CHECK_MS"]["source"] == "default", "SHOAL_IDLE_CHECK_MS from the default")
unhonoured = {u["name"]: u for u in doc["environment"]["unhonoured"]}
check(unhonoured.get("NCCL_PROTO", {}).get("level") == "WARN", "NCCL_PROTO listed as unhonoured at WARN")
check("NCCL_NTHREADS" not in unhonoured, "an unset variable is not listed")

layout = doc["layout"]
check(layout["ranks"] == 8 and layout["nodes"] == 2 and layout["ranks_per_node"] == 4, "layout 8 ranks, 2 nodes")
check(layout["transports"].get("inside_node") == "shm", f"inside a node: {layout['transports']}")
check(layout["transports"].get("between_nodes") == "tcp", f"between nodes: {layout['transports']}")
kinds = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "AlltoAll"}
rows = layout["tuner"]
seen = {(r["collective"], r["bytes"]) for r in rows if "algorithm" in r}
for k in kinds:
    for b in (8, 1 << 20, 1 << 30):
        check((k, b) in seen, f"tuner table lacks {k} at {b} bytes")
check(all(r.get("channels", 0) >= 1 for r in rows if "algorithm" in r), "channels >= 1")
# SHOAL_SEGMENT_BYTES forces the segment: the table must come from the tuner
# configured by this environment, not from a copy of its defaults.
check(all(r["segment_bytes"] == 262144 for r in rows if "algorithm" in r), "SHOAL_SEGMENT_BYTES honoured in the table")
# A layout on one node has no between-nodes transport.
one = json.loads(subprocess.run([info, "--json", "--ranks", "4"], env=env, capture_output=True, text=True,
                                timeout=60).stdout)
check("between_nodes" not in one["layout"]["transports"], "one node: no between-nodes transport")
bad = subprocess.run([info, "--ranks", "2", "--nodes", "3"], env=env, capture_output=True, text=True, timeout=60)
check(bad.returncode == 2 and "--nodes 3" in bad.stderr, "more nodes than ranks is refused")

print("FAILED" if failures else "PASS")
sys.exit(1 if failures else 0)
