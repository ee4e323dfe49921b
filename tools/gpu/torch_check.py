"""torch.distributed on CUDA tensors through Shoal's libnccl.so.2 (LD_PRELOAD).

Run by tools/gpu/check.sh under `torchrun --nproc-per-node N` with
LD_PRELOAD pointing at Shoal's library. Every rank uses cuda:0 unless more
GPUs exist (Shoal allows several ranks per GPU). First makes sure Shoal
serves this process's NCCL calls (nccl_in_use), then checks all_reduce,
all_gather_into_tensor, reduce_scatter_tensor, broadcast, send/recv and an
async work handle in float32 and bfloat16, and an all_reduce captured into a
CUDA graph and replayed, with exact expected values.
"""
import ctypes
import os
import re
import sys
import time

import torch
import torch.distributed as dist


def _version_of(lib):
    """(major, minor, patch) from lib's ncclGetVersion, or None."""
    try:
        fn = lib.ncclGetVersion
    except AttributeError:
        return None
    code = ctypes.c_int(0)
    if fn(ctypes.byref(code)) != 0:
        return None
    v = code.value
    base = 1000 if v < 2900 else 10000  # NCCL's encoding changed at 2.9
    return (v // base, v % base // 100, v % 100)


def version_text(version):
    return ".".join(map(str, version)) if version else "unknown"


def nccl_in_use():
    """Which NCCL this process's calls reach: (version, Shoal's version
    string or None, {libnccl path mapped: its version}).

    PyTorch's calls bind through the global symbol scope, where LD_PRELOAD
    comes before everything PyTorch loads: the version is the one
    ncclGetVersion answers there (ctypes.CDLL(None)), and Shoal's string is
    shoalGetVersionString found there. The files mapped are for information
    only: PyTorch may load NVIDIA's libnccl.so.2 by its full path in every
    process (its preload of the CUDA wheels' libraries), which maps it
    without its symbols serving PyTorch's calls. Where the global scope has
    no NCCL (none preloaded), the version is the mapped library's.
    torch.cuda.nccl.version() says nothing here: it is the NCCL PyTorch was
    compiled against, fixed at its build.
    """
    scope = ctypes.CDLL(None)
    version = _version_of(scope)
    try:
        fn = scope.shoalGetVersionString
        fn.restype = ctypes.c_char_p
        shoal = fn().decode()
    except AttributeError:
        shoal = None
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libnccl" in line and "/" in line})
    mapped = {}
    for path in paths:
        try:
            mapped[path] = version_text(_version_of(ctypes.CDLL(path)))
        except OSError as e:
            mapped[path] = f"not loadable: {e}"
    if version is None and len(paths) == 1:
        version = _version_of(ctypes.CDLL(paths[0]))
    return version, shoal, mapped


def shoal_serves(version, shoal):
    """None when Shoal serves this process's NCCL calls, else why not."""
    if shoal is None:
        return "shoalGetVersionString is not in the process's global scope (no Shoal in LD_PRELOAD)"
    m = re.search(r"NCCL (\d+)\.(\d+)\.(\d+)", shoal)
    if m is None:
        return f"no NCCL version in Shoal's version string {shoal!r}"
    want = tuple(int(g) for g in m.groups())
    if version != want:
        return f"ncclGetVersion answers {version_text(version)}, not Shoal's {version_text(want)}"
    return None


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    ngpu = torch.cuda.device_count()
    device = torch.device("cuda", rank % ngpu)
    torch.cuda.set_device(device)
    version, shoal, mapped = nccl_in_use()
    print(f"rank {rank}/{world} on {device} ({ngpu} GPUs); NCCL in use: {version_text(version)} "
          f"({shoal or 'not Shoal'}); libnccl mapped (information only): {mapped}; "
          f"PyTorch built against NCCL {torch.cuda.nccl.version()}", flush=True)
    why = shoal_serves(version, shoal)
    if why is not None:
        print(f"rank {rank}: FAIL: Shoal does not serve this process's NCCL calls: {why}", flush=True)
        sys.exit(2)
    dist.init_process_group("nccl", device_id=device)

    failures = []

    def expect(name, got, want):
        if not torch.equal(got, want):
            bad = (got != want).flatten().nonzero().flatten()
            i = bad[0].item()
            failures.append(f"{name}: {bad.numel()} wrong, first at {i}: "
                            f"{got.flatten()[i].item()} vs {want.flatten()[i].item()}")

    n = 1 << 20
    for dtype in (torch.float32, torch.bfloat16):
        base = torch.arange(n, device=device) % 32  # sums stay exact in bfloat16 (< 256)
        # all_reduce (sum of rank + 1 plus the same base on every rank)
        x = (base + rank + 1).to(dtype)
        dist.all_reduce(x)
        want = (base * world + world * (world + 1) // 2).to(dtype)
        expect(f"all_reduce {dtype}", x, want)
        # async handle, consumed by a kernel on the current stream without a host sync
        y = torch.full((n,), float(rank + 1), device=device, dtype=dtype)
        work = dist.all_reduce(y, async_op=True)
        work.wait()
        z = y * 2
        torch.cuda.synchronize()
        expect(f"async all_reduce {dtype}", z,
               torch.full((n,), float(world * (world + 1)), device=device, dtype=dtype))
        # all_gather_into_tensor
        mine = torch.full((1024,), float(rank), device=device, dtype=dtype)
        out = torch.empty(1024 * world, device=device, dtype=dtype)
        dist.all_gather_into_tensor(out, mine)
        expect(f"all_gather_into_tensor {dtype}", out,
               torch.arange(world, device=device).repeat_interleave(1024).to(dtype))
        # reduce_scatter_tensor
        inp = torch.arange(world, device=device).repeat_interleave(512).to(dtype)
        part = torch.empty(512, device=device, dtype=dtype)
        dist.reduce_scatter_tensor(part, inp)
        expect(f"reduce_scatter_tensor {dtype}", part,
               torch.full((512,), float(rank * world), device=device, dtype=dtype))
        # broadcast from the last rank
        b = torch.full((4096,), float(rank), device=device, dtype=dtype)
        dist.broadcast(b, src=world - 1)
        expect(f"broadcast {dtype}", b, torch.full((4096,), float(world - 1), device=device, dtype=dtype))
        # send/recv around a ring, batched
        send = torch.full((2048,), float(rank), device=device, dtype=dtype)
        recv = torch.empty(2048, device=device, dtype=dtype)
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
               dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        torch.cuda.synchronize()
        expect(f"send/recv {dtype}", recv,
               torch.full((2048,), float((rank - 1) % world), device=device, dtype=dtype))

    # CUDA graph capture (torch.cuda.graph): all_reduce captured once after a
    # warm-up on a side stream, replayed three times on new inputs.
    g = torch.zeros(1 << 16, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(g)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(g)
    for k in range(1, 4):
        g.fill_(float(rank + k))
        graph.replay()
        torch.cuda.synchronize()
        expect(f"all_reduce in a CUDA graph, replay {k}", g,
               torch.full_like(g, float(world * (world - 1) // 2 + world * k)))
    del graph

    # A bandwidth figure: 256 MiB float32 all_reduce.
    big = torch.ones(64 << 20, device=device)
    for _ in range(3):
        dist.all_reduce(big)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    iters = 10
    for _ in range(iters):
        dist.all_reduce(big)
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / iters
    busbw = big.numel() * 4 / sec * 2 * (world - 1) / world / 1e9
    dist.barrier()
    if rank == 0:
        print(f"all_reduce 256 MiB float32: {sec * 1e3:.2f} ms, busbw {busbw:.2f} GB/s", flush=True)
    dist.destroy_process_group()
    if failures:
        for f in failures:
            print(f"rank {rank}: FAIL {f}", flush=True)
        sys.exit(1)
    print(f"rank {rank}: PASS", flush=True)


if __name__ == "__main__":
    main()
