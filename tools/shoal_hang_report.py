#!/usr/bin/env python3
"""Merges Shoal's hang reports and names the ranks the others wait for.

Each rank writes one JSON object per report (docs/diagnostics.md): into
SHOAL_REPORT_DIR as shoal-report-*.json files, or into its log as a line
"... hang report: {...}". Give this tool the files, directories or logs of
every rank:

    python3 tools/shoal_hang_report.py /shared/reports [rank logs ...]

Per communicator it prints what each rank's latest report says, then one
"STALLED:" line per rank that the others wait for: a rank that has not
called the collective the others are in, or a rank that others wait on while
it is in no operation. Exit status: 0 when it named at least one rank, 1 when
the reports show no stalled rank, 2 on bad input.
"""
import json
import os
import sys


def reports_in_text(text, origin):
    """Every report object in a file: a whole-file JSON object or log lines."""
    text = text.strip()
    if text.startswith("{"):
        try:
            yield json.loads(text)
            return
        except json.JSONDecodeError:
            pass
    for line in text.splitlines():
        at = line.find("hang report: {")
        if at < 0:
            at = line.find("report: {")
            if at < 0:
                continue
        payload = line[line.index("{", at):]
        try:
            yield json.loads(payload)
        except json.JSONDecodeError as e:
            print(f"{origin}: unreadable report ({e})", file=sys.stderr)


def load(paths):
    reports = []
    for path in paths:
        files = []
        if os.path.isdir(path):
            files = [os.path.join(path, f) for f in sorted(os.listdir(path))]
        else:
            files = [path]
        for f in files:
            with open(f, encoding="utf-8", errors="replace") as handle:
                for report in reports_in_text(handle.read(), f):
                    if report.get("shoal_report") == 1:
                        reports.append(report)
    return reports


def who(r):
    return f"rank {r['rank']} (host {r['host']}, pid {r['pid']})"


def is_collective(what):
    # "comm ... : AllReduce #4 (ring)" -- Send/Recv count per peer, not per communicator.
    kind = what.split(": ", 1)[-1].split(" ", 1)[0]
    return kind not in ("Send", "Recv")


def analyse(comm, reports):
    """Returns (lines describing the ranks, list of STALLED lines)."""
    latest = {}
    for r in reports:
        if r["rank"] not in latest or r["unix_ms"] >= latest[r["rank"]]["unix_ms"]:
            latest[r["rank"]] = r
    nranks = max(r["nranks"] for r in reports)
    lines = [f"communicator {comm}: {nranks} ranks, reports from {len(latest)}"]
    for rank in sorted(latest):
        r = latest[rank]
        f = r.get("in_flight")
        if f:
            state = (f"in {f['what'].split(': ', 1)[-1]}, {f['steps_done']}/{f['steps_total']} steps, "
                     f"idle {f['idle_ms']} ms, waiting on {f['waiting_on'] or 'nothing posted'}")
        else:
            state = "in no operation"
        err = f"; error: {r['error']}" if r.get("error") else ""
        lines.append(f"  {who(r)} [{r['reason']}]: {r['collectives_issued']} collectives issued, {state}{err}")
    missing = [q for q in range(nranks) if q not in latest]
    if missing:
        lines.append(f"  no report from ranks {missing} (dead, not asked, or another directory)")

    stalled = {}
    # 1. A collective some ranks are in that others have not called.
    for r in latest.values():
        f = r.get("in_flight")
        if not f or not is_collective(f["what"]):
            continue
        seq = f["sequence"]
        for q in latest.values():
            if q["rank"] == r["rank"] or q["collectives_issued"] > seq:
                continue
            waiting = sorted(p["rank"] for p in latest.values()
                             if p.get("in_flight") and p["in_flight"]["sequence"] == seq
                             and is_collective(p["in_flight"]["what"]))
            what = f["what"].split(": ", 1)[-1].split(" (")[0]
            stalled[q["rank"]] = (f"{who(q)} has not called {what}: it issued {q['collectives_issued']} "
                                  f"collectives; ranks {waiting} wait in it")
    # 2. Ranks others wait on that are in no operation (or never reported).
    for r in latest.values():
        f = r.get("in_flight")
        if not f:
            continue
        for peer in f["waiting_on"]:
            if peer in stalled:
                continue
            q = latest.get(peer)
            if q is None:
                stalled[peer] = f"rank {peer} (no report) is waited on by rank {r['rank']}"
            elif not q.get("in_flight") and q["rank"] not in stalled:
                stalled[peer] = f"{who(q)} is in no operation while rank {r['rank']} waits on it"
    return lines, [f"STALLED: {stalled[k]}" for k in sorted(stalled)]


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    reports = load(argv[1:])
    if not reports:
        print("no hang reports found", file=sys.stderr)
        return 2
    by_comm = {}
    for r in reports:
        by_comm.setdefault(r["comm"], []).append(r)
    named = False
    for comm in sorted(by_comm):
        lines, stalled = analyse(comm, by_comm[comm])
        print("\n".join(lines))
        if stalled:
            named = True
            print("\n".join("  " + s for s in stalled))
        else:
            print("  no stalled rank found: every rank is in an operation (a cycle, or a mismatch?)")
    return 0 if named else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
