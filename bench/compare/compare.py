#!/usr/bin/python3
"""Summarizes a bench/compare run folder (see README.md).

Reads OUT/raw/<op>_np<N>_r<round>_<library>.csv (the --csv files of Shoal's
perf binaries and of our peer programs: same columns) and OUT/rounds.csv
(contention probe before/after each round), and writes:

  OUT/results.csv            one row per (op, nranks, library, size): medians
  OUT/table.md               the tables printed on stdout
  OUT/busbw_<op>_np<N>.png   busbw vs size, one line per library

Per (library, size) the median is over the launches whose round the probe
did not mark as contended (probe >= --quiet-us before or after); if every
launch was contended, over all of them, and the cell is marked '*'. The
median is a launch's busbw (for an even count the better of the middle two),
and the time shown is that launch's time.
Ratios: Shoal shm / best peer (any transport) and Shoal tcp / best TCP peer
(MPI tcp, Gloo ring, Gloo HD), on median busbw; > 1 means Shoal is faster.

Run with Debian's /usr/bin/python3 (matplotlib from python3-matplotlib); the
PNGs are skipped with a note when matplotlib is missing.
"""
import argparse
import csv
import glob
import os
import re
import sys
from collections import defaultdict

LABELS = {
    "shoal_shm": "Shoal (shm)",
    "shoal_tcp": "Shoal (tcp)",
    "mpi_vader": "MPI vader",
    "mpi_tcp": "MPI tcp",
    "mpi_ucx": "MPI ucx",
    "gloo_ring": "Gloo ring",
    "gloo_hd": "Gloo HD",
    "shoal_ofi_shm": "Shoal ofi shm",
    "shoal_ofi_tcp": "Shoal ofi tcp",
    "mpi_ofi_tcp": "MPI ofi tcp",
}
ORDER = list(LABELS)
SHOAL = ("shoal_shm", "shoal_tcp", "shoal_ofi_shm", "shoal_ofi_tcp")
TCP_PEERS = ("mpi_tcp", "gloo_ring", "gloo_hd")
SHM_PEERS = ("mpi_vader", "mpi_ucx")


def ratio_columns(cols):
    """(Shoal line, peer lines, header) for every ratio column this table has."""
    peers = [l for l in cols if l not in SHOAL]
    wanted = [
        ("shoal_shm", peers, "Shoal shm / best peer"),
        ("shoal_tcp", [l for l in cols if l in TCP_PEERS], "Shoal tcp / best tcp peer"),
        ("shoal_ofi_shm", [l for l in cols if l in SHM_PEERS], "Shoal ofi shm / best shm peer"),
        ("shoal_ofi_tcp", [l for l in cols if l == "mpi_ofi_tcp"], "Shoal ofi tcp / MPI ofi tcp"),
        ("shoal_ofi_tcp", [l for l in cols if l == "shoal_tcp"], "Shoal ofi tcp / Shoal tcp"),
    ]
    return [(shoal, group, head) for shoal, group, head in wanted if shoal in cols and group]
NAME = re.compile(r"^(allreduce|allgather|reduce_scatter)_np(\d+)_r(\d+)_(\w+)\.csv$")


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024


def load(out, quiet_us):
    contended = {}  # (op, np, round) -> bool
    rounds_file = os.path.join(out, "rounds.csv")
    if os.path.exists(rounds_file):
        with open(rounds_file) as f:
            for r in csv.DictReader(f):
                key = (r["op"], int(r["nranks"]), int(r["round"]))
                if quiet_us is None and r.get("contended") in ("0", "1"):
                    flagged = r["contended"] == "1"  # as compare.sh decided
                else:
                    probes = [float(r[k]) for k in ("probe_before_us", "probe_after_us") if r[k]]
                    flagged = any(p >= (quiet_us or 100.0) for p in probes)
                contended[key] = contended.get(key, False) or flagged
    # (op, np, lib, bytes) -> list of (busbw, time_us, contended, in_place)
    runs = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(out, "raw", "*.csv"))):
        m = NAME.match(os.path.basename(path))
        if not m:
            continue
        op, np_, rnd, lib = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        with open(path) as f:
            rows = [r for r in csv.DictReader(f) if int(r["bytes"]) > 0]
        # Out-of-place where measured (all but Gloo's in-place algorithm classes).
        have_oop = {int(r["bytes"]) for r in rows if r["in_place"] == "0"}
        for r in rows:
            size = int(r["bytes"])
            in_place = r["in_place"] == "1"
            if in_place and size in have_oop:
                continue
            if r["wrong"] not in ("0", "N/A"):
                print(f"warning: {path}: {r['wrong']} wrong at {size} B", file=sys.stderr)
            runs[(op, np_, lib, size)].append(
                (float(r["busbw"]), float(r["time_us"]), contended.get((op, np_, rnd), False), in_place))
    return runs


def summarize(runs):
    """-> {(op, np): {lib: {size: dict}}}"""
    out = defaultdict(lambda: defaultdict(dict))
    for (op, np_, lib, size), rs in runs.items():
        clean = [r for r in rs if not r[2]]
        used = sorted(clean or rs)  # by busbw
        # The median launch (for an even count the better of the middle two,
        # since contention only ever slows a launch down); its time goes with it.
        mid = used[len(used) // 2]
        out[(op, np_)][lib][size] = {
            "runs": len(rs),
            "used": len(used),
            "contended_only": not clean,
            "busbw": mid[0],
            "busbw_min": used[0][0],
            "busbw_max": used[-1][0],
            "time_us": mid[1],
            "in_place": any(r[3] for r in used),
        }
    return out


def ratio(num, den):
    return num / den if num is not None and den else None


def tables(summary):
    lines = []
    for (op, np_) in sorted(summary):
        libs = summary[(op, np_)]
        cols = [l for l in ORDER if l in libs] + sorted(l for l in libs if l not in ORDER)
        ratios = ratio_columns(cols)
        sizes = sorted({s for l in cols for s in libs[l]})
        nruns = max((v["runs"] for l in cols for v in libs[l].values()), default=0)
        inplace = [LABELS.get(l, l) for l in cols if any(v["in_place"] for v in libs[l].values())]
        lines.append(f"### {op}, {np_} ranks: busbw GB/s, median of {nruns} interleaved launches "
                     f"[time us up to 64 KiB]")
        lines.append("")
        notes = ["* = every launch of that cell ran in a round the contention probe flagged"]
        if inplace:
            notes.append("in place (the API has no out-of-place form): " + ", ".join(inplace))
        lines.append("; ".join(notes))
        lines.append("")
        head = ["size"] + [LABELS.get(l, l) for l in cols] + [h for _, _, h in ratios]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---:|" * len(head))
        for s in sizes:
            cells = [human(s)]
            for l in cols:
                v = libs[l].get(s)
                if v is None:
                    cells.append("-")
                    continue
                c = f"{v['busbw']:.3f}"
                if s <= 65536:
                    c += f" [{v['time_us']:.1f}]"
                if v["contended_only"]:
                    c += "*"
                cells.append(c)

            def best(group):
                have = [(libs[l][s]["busbw"], l) for l in group if s in libs[l]]
                return max(have) if have else (None, None)

            for shoal, group, _ in ratios:
                bw, who = best(group)
                mine = libs[shoal].get(s, {}).get("busbw")
                r = ratio(mine, bw)
                cells.append(f"{r:.2f} ({LABELS.get(who, who)})" if r is not None else "-")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_csv(summary, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "nranks", "library", "bytes", "runs", "runs_used", "contended_only",
                    "in_place", "busbw_median", "busbw_min", "busbw_max", "time_us_median"])
        for (op, np_) in sorted(summary):
            for lib in sorted(summary[(op, np_)], key=lambda l: (ORDER + [l]).index(l)):
                for s, v in sorted(summary[(op, np_)][lib].items()):
                    w.writerow([op, np_, lib, s, v["runs"], v["used"], int(v["contended_only"]),
                                int(v["in_place"]), f"{v['busbw']:.6g}", f"{v['busbw_min']:.6g}",
                                f"{v['busbw_max']:.6g}", f"{v['time_us']:.6g}"])


def plot(summary, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib missing (apt-get install python3-matplotlib); no PNG written",
              file=sys.stderr)
        return []
    styles = {"shoal_shm": ("C3", "-", 2.4), "shoal_tcp": ("C3", "--", 2.4),
              "mpi_vader": ("C0", "-", 1.4), "mpi_tcp": ("C0", "--", 1.4),
              "mpi_ucx": ("C0", ":", 1.4), "gloo_ring": ("C2", "--", 1.4),
              "gloo_hd": ("C2", "-.", 1.4),
              "shoal_ofi_shm": ("C1", "-", 2.4), "shoal_ofi_tcp": ("C1", "--", 2.4),
              "mpi_ofi_tcp": ("C4", "--", 1.4)}
    written = []
    for (op, np_) in sorted(summary):
        libs = summary[(op, np_)]
        fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
        all_sizes = set()
        for lib in [l for l in ORDER if l in libs] + [l for l in libs if l not in ORDER]:
            pts = sorted(libs[lib].items())
            xs = [s for s, _ in pts]
            all_sizes.update(xs)
            color, ls, lw = styles.get(lib, (None, "-", 1.4))
            ax.plot(xs, [v["busbw"] for _, v in pts], ls, color=color, lw=lw, marker=".",
                    label=LABELS.get(lib, lib))
            ax.fill_between(xs, [v["busbw_min"] for _, v in pts], [v["busbw_max"] for _, v in pts],
                            color=color, alpha=0.12, lw=0)
        ax.set_xscale("log", base=2)
        ticks = [s for s in sorted(all_sizes) if (s.bit_length() - 1) % 2 == 0] or sorted(all_sizes)
        ax.set_xticks(ticks)
        ax.set_xticklabels([human(s).replace(" ", "").replace("iB", "") for s in ticks],
                           rotation=45, fontsize=8)
        ax.set_xlabel("size (bytes, log2)")
        ax.set_ylabel("busbw (GB/s)")
        cells = [v for l in libs.values() for v in l.values()]
        flagged = sum(v["contended_only"] for v in cells)
        note = f"; {flagged}/{len(cells)} points from contended rounds only" if flagged else ""
        ax.set_title(f"{op}, {np_} ranks on one host (median; band = min-max of launches{note})",
                     fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        path = os.path.join(out, f"busbw_{op}_np{np_}.png")
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the compare.sh --out folder")
    ap.add_argument("--quiet-us", type=float, default=None,
                    help="probe reading (one-way us) at or above which a round counts as contended "
                         "(default: the run's own marks in rounds.csv, else 100)")
    ap.add_argument("--no-plot", action="store_true")
    a = ap.parse_args()
    runs = load(a.out, a.quiet_us)
    if not runs:
        sys.exit(f"no results under {a.out}/raw")
    summary = summarize(runs)
    text = tables(summary)
    meta = os.path.join(a.out, "meta.txt")
    header = open(meta).read() if os.path.exists(meta) else ""
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(header + "\n" + text)
    write_csv(summary, os.path.join(a.out, "results.csv"))
    print(text)
    if not a.no_plot:
        for p in plot(summary, a.out):
            print(f"wrote {p}")
    print(f"wrote {os.path.join(a.out, 'results.csv')} and {os.path.join(a.out, 'table.md')}")


if __name__ == "__main__":
    main()
