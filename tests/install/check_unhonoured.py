#!/usr/bin/env python3
"""An NCCL variable NVIDIA documents and Shoal does not honour is said once
per process, with its reason: at WARN where a user may rely on it
(NCCL_PROTO), at INFO where harmless (NCCL_NTHREADS), also when it comes from
NCCL_CONF_FILE, and never when unset or with logging off. The probe creates
three communicators (1 rank, then 2), so "once" is tested.

    check_unhonoured.py CONSUMER
"""
import os
import subprocess
import sys
import tempfile

probe = sys.argv[1]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_") or k == "NCCL_SOCKET_IFNAME"}
    env.update(extra)
    p = subprocess.run([probe], env=env, capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"probe exited {p.returncode}: {p.stderr}")
    return (p.stdout + p.stderr).splitlines()


lines = run(NCCL_DEBUG="INFO", NCCL_PROTO="LL", NCCL_NTHREADS="256")
proto = [l for l in lines if "NCCL_PROTO=LL" in l]
threads = [l for l in lines if "NCCL_NTHREADS=256" in l]
print("\n".join(proto + threads))
check(len(proto) == 1, f"NCCL_PROTO said {len(proto)} times, want once")
check(len(threads) == 1, f"NCCL_NTHREADS said {len(threads)} times, want once")
check(all("NCCL WARN" in l and "not honoured" in l and "LL/LL128/Simple" in l for l in proto), "NCCL_PROTO at WARN, with reason")
check(all("NCCL INFO" in l and "ignored" in l for l in threads), "NCCL_NTHREADS at INFO")

lines = run(NCCL_DEBUG="WARN", NCCL_PROTO="LL", NCCL_NTHREADS="256")
check(sum("NCCL_PROTO=LL" in l for l in lines) == 1, "NCCL_DEBUG=WARN: NCCL_PROTO said once")
check(not any("NCCL_NTHREADS" in l for l in lines), "NCCL_DEBUG=WARN: the INFO line is not shown")

lines = run(NCCL_DEBUG="INFO")
check(not any("not honoured" in l or "is ignored:" in l for l in lines), "nothing said when none is set")

lines = run(NCCL_PROTO="LL")
check(not any("NCCL_PROTO" in l for l in lines), "nothing said with logging off (NVIDIA NCCL's default)")

with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as conf:
    conf.write("NCCL_TOPO_FILE=/tmp/topo.xml\n")
try:
    lines = run(NCCL_DEBUG="WARN", NCCL_CONF_FILE=conf.name)
    topo = [l for l in lines if "NCCL_TOPO_FILE=/tmp/topo.xml" in l]
    print("\n".join(topo))
    check(len(topo) == 1 and f"config file {conf.name}" in topo[0], "a variable from NCCL_CONF_FILE is said, naming the file")
finally:
    os.unlink(conf.name)

print("FAILED" if failures else "PASS")
sys.exit(1 if failures else 0)
