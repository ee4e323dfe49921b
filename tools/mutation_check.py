#!/usr/bin/env python3
"""Mutation check: break one chosen line at a time and show the suite fails.

Each mutant changes one line of the library (a reducer's arithmetic, a tag
check, a deadline, a message-size check, the fp8 saturation constant, the
CUDA stream gate, the cross-rank call check), rebuilds only what the tests
that should catch it need, runs those tests, and restores the file (also on
Ctrl-C). A mutant the tests do not catch is reported SURVIVED and the script
exits 1.

    python3 tools/mutation_check.py [--build build] [--only NAME ...]

Needs a configured and built tree (bash scripts/build.sh). The source files
a mutant touches must have no uncommitted changes. Takes a few minutes.
"""
import argparse
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

# name, file, exact text, replacement, build targets, ctest -R regex, what it breaks
MUTANTS = [
    ("reducer-sum", "src/reduce/reduce_scalar.cc",
     "static S sum(S a, S b) { return canon(a + b); }",
     "static S sum(S a, S b) { return canon(a - b); }",
     ["unit_tests", "sim_tests"], "combine|every collective",
     "the scalar kernels' sum subtracts"),
    ("loopback-tag-check", "transports/loopback/loopback_connection.cc",
     "if (s.tag != r.tag || s.bytes != r.bytes) {",
     "if (false) {",
     ["transport_tests", "core_unit_tests", "sim_tests"], "loopback|mismatch",
     "the loopback pipe delivers a message to a receive of another operation"),
    ("shm-message-check", "transports/shm/shm_connection.cc",
     "if (header->tag != op.tag || header->messageBytes != op.bytes)",
     "if (false)",
     ["transport_tests", "mp_tests"], "shm|mismatch",
     "shm accepts a frame of another operation or size"),
    ("no-progress-deadline", "src/engine/engine.cc",
     "if (limitMs > 0 && now - job.lastProgressNs_ > limitMs * 1000000) failJob(job, timeoutStatus(job));",
     "if (false) failJob(job, timeoutStatus(job));",
     ["mp_tests", "core_unit_tests", "api_behaviour_tests"], "stops calling|no progress|deadline",
     "a job that moves no byte never times out"),
    ("fp8-saturation", "src/reduce/numerics.h",
     "inline constexpr SmallFormat kE4m3Format{3, 7, 8, 0x43E80000u, kFp8Saturate ? 0x7Eu : 0x7Fu,",
     "inline constexpr SmallFormat kE4m3Format{3, 7, 8, 0x43E80000u, kFp8Saturate ? 0x7Du : 0x7Fu,",
     ["unit_tests"], "small format|fp8|combine",
     "e4m3 overflow saturates to 416 instead of 448"),
    ("stream-gate", "src/engine/engine.cc",
     "if (job.streamReady && !job.streamReached()) {",
     "if (false) {",
     ["cudafake_device_tests"], "device buffers|stream",
     "a device job starts before its stream has staged the inputs"),
    ("call-check", "src/comm/call_check.cc",
     'return mode == "1" || mode == "full";',
     "return false;",
     ["mp_check_mode_tests"], "check mode",
     "SHOAL_CHECK_MODE=1 compares nothing"),
]


def run(cmd, cwd, timeout):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    build = (ROOT / args.build).resolve()
    if not (build / "CMakeCache.txt").exists():
        sys.exit(f"mutation_check: {build} is not a configured build (bash scripts/build.sh)")
    chosen = [m for m in MUTANTS if not args.only or m[0] in args.only]
    survived = []
    for name, rel, old, new, targets, regex, what in chosen:
        path = ROOT / rel
        original = path.read_text()
        if original.count(old) != 1:
            sys.exit(f"mutation_check: {name}: the line to mutate is not found exactly once in {rel}")
        dirty = run(["git", "diff", "--quiet", "--", rel], ROOT, 60).returncode != 0
        if dirty:
            sys.exit(f"mutation_check: {rel} has uncommitted changes; commit or stash them first")
        t0 = time.time()
        try:
            path.write_text(original.replace(old, new))
            b = run(["cmake", "--build", str(build), "-j2", "--target", *targets], ROOT, 1800)
            if b.returncode != 0:
                print(f"{name}: the mutant does not build (counts as caught)\n{b.stdout[-2000:]}")
                continue
            t = run(["ctest", "-R", regex, "--timeout", "120", "-j2"], build, 3600)
            failed = [l for l in t.stdout.splitlines() if "***" in l or "Failed" in l and "Test #" in l]
            caught = t.returncode != 0
            verdict = "CAUGHT" if caught else "SURVIVED"
            print(f"{verdict:8} {name:22} ({what}): {len(failed)} test(s) failed, {time.time() - t0:.0f} s")
            for line in failed[:5]:
                print(f"           {line.strip()}")
            if not caught:
                survived.append(name)
        finally:
            path.write_text(original)
    # Rebuild the restored tree so that it is as it was.
    all_targets = sorted({t for m in chosen for t in m[4]})
    run(["cmake", "--build", str(build), "-j2", "--target", *all_targets], ROOT, 1800)
    if survived:
        print(f"mutation_check: SURVIVED: {', '.join(survived)}")
        return 1
    print(f"mutation_check: all {len(chosen)} mutants caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
