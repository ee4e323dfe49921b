"""The GPU goal's figures through PyTorch: AllReduce, AllGather and
ReduceScatter on one GPU shared by N processes, beside a device-to-device
copy and the bound; and the 8 B AllReduce latency.

Run by tools/gpu/check.sh under `torchrun --nproc-per-node N` with Shoal's
libnccl.so.2 in LD_PRELOAD (device-direct by default: cuda_ipc, stream
plans; BENCH_EXPECT=shoal: fail unless Shoal serves the calls). PyTorch's
own NCCL cannot be compared there: NVIDIA's NCCL refuses several ranks on
one GPU at init ("Duplicate GPU detected") unless it is recent enough to
honour NCCL_MULTI_RANK_GPU_ENABLE=1, and the one PyTorch 2.11 bundles
(2.28.9) is not; check.sh then says so, runs it only when a newer one
is there, and the bound is the reference.

N ranks sharing one GPU must read every input and write every output once,
so busbw <= B (N - 1) / N^2, B being the device copy bandwidth (read +
write), measured by rank 0 before any rank initializes NCCL (the others wait
for it in their init, doing no GPU work). Prints one line per collective and
size: time, busbw (nccl-tests' definition), and busbw as a fraction of that
bound; and the 8 B AllReduce latency. Sizes (BENCH_SIZES, bytes, comma
separated; 1 GiB by default) are rounded down to a multiple of 4 N bytes, so
that every rank's share of a ReduceScatter is whole float32 elements.

Also, without torchrun: `--probe` prints PyTorch's versions, the NCCL this
process uses and B ("copy-gbs: ..."); `--nccl-version` prints that NCCL's
version alone.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

from torch_check import nccl_in_use, shoal_serves, version_text


def copy_bandwidth(device, nbytes, iters=10):
    """Read + write bytes per second of a device-to-device copy of nbytes."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize(device)
    seconds = start.elapsed_time(end) / 1e3 / iters
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def timed(fn, iters, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def probe():
    version, shoal, mapped = nccl_in_use()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}; built against NCCL "
          f"{torch.cuda.nccl.version()} (torch.cuda.nccl.version(): fixed when PyTorch was built)")
    print(f"NCCL in use: {version_text(version)}{f' ({shoal})' if shoal else ''}; libnccl mapped: {mapped}")
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        p = torch.cuda.get_device_properties(device)
        print(f"{torch.cuda.device_count()} GPU(s); cuda:0 {p.name}, {p.total_memory >> 30} GiB, "
              f"{p.multi_processor_count} multiprocessors")
        copy = copy_bandwidth(device, 1 << 30)
        print(f"device copy 1024 MiB: {copy / 1e9:.0f} GB/s read+write (mean of 10)")
        print(f"copy-gbs: {copy / 1e9:.0f}")
    else:
        print("PyTorch sees no GPU")
    print(f"nccl-in-use: {version_text(version)}", flush=True)


def main():
    if sys.argv[1:] == ["--probe"]:
        probe()
        return
    if sys.argv[1:] == ["--nccl-version"]:
        print(version_text(nccl_in_use()[0]))
        return
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    label = os.environ.get("BENCH_LABEL", "?")
    version, shoal, _ = nccl_in_use()
    if rank == 0:
        print(f"[{label}] NCCL in use: {version_text(version)}{f' ({shoal})' if shoal else ''}", flush=True)
    if os.environ.get("BENCH_EXPECT") == "shoal":
        why = shoal_serves(version, shoal)
        if why is not None:
            print(f"[{label}] rank {rank}: FAIL: Shoal does not serve this process's NCCL calls: {why}", flush=True)
            sys.exit(2)
    unit = 4 * world
    sizes = [max(unit, int(s) // unit * unit) for s in os.environ.get("BENCH_SIZES", str(1 << 30)).split(",")]
    # B before any NCCL work: the other ranks wait in their init for rank 0.
    bound = None
    if rank == 0:
        copy = copy_bandwidth(device, max(sizes))
        bound = copy * (world - 1) / world ** 2
        print(f"[{label}] device copy {max(sizes) >> 20} MiB: {copy / 1e9:.0f} GB/s read+write; "
              f"bound for {world} ranks on one GPU: {bound / 1e9:.0f} GB/s busbw", flush=True)
    dist.init_process_group("nccl", device_id=device)
    ok = True
    for nbytes in sizes:
        n = nbytes // 4
        x = torch.full((n,), float(rank + 1), dtype=torch.float32, device=device)
        gathered = torch.empty(n * world, dtype=torch.float32, device=device)
        part = torch.empty(n // world, dtype=torch.float32, device=device)
        runs = {
            # busbw factors as nccl-tests: 2(N-1)/N, (N-1)/N, (N-1)/N.
            "all_reduce": (lambda: dist.all_reduce(x), 2 * (world - 1) / world, nbytes),
            "all_gather": (lambda: dist.all_gather_into_tensor(gathered, x), (world - 1) / world, nbytes * world),
            "reduce_scatter": (lambda: dist.reduce_scatter_tensor(part, x), (world - 1) / world, nbytes),
        }
        for name, (fn, factor, size) in runs.items():
            seconds = timed(fn, iters=5)
            busbw = size / seconds * factor
            if rank == 0:
                share = f", {busbw / bound:.0%} of the bound" if bound else ""
                print(f"[{label}] {name} {size >> 20} MiB: {seconds * 1e3:.2f} ms, busbw {busbw / 1e9:.1f} GB/s{share}",
                      flush=True)
        del x, gathered, part
        # The timed rounds reduce their own results again and again: check a fresh one.
        y = torch.full((1024,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(y)
        want = world * (world + 1) / 2
        if not torch.all(y == want):
            bad = (y != want).nonzero().flatten()[0].item()
            print(f"[{label}] rank {rank}: FAIL all_reduce gave {y[bad].item()} at {bad} instead of {want}",
                  flush=True)
            ok = False
    tiny = torch.ones(2, dtype=torch.float32, device=device)
    seconds = timed(lambda: dist.all_reduce(tiny), iters=200, warmup=20)
    if rank == 0:
        print(f"[{label}] all_reduce 8 B latency: {seconds * 1e6:.1f} us", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
