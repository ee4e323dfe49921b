"""The GPU goal's figures: AllReduce, AllGather and ReduceScatter on one GPU
shared by N processes, beside a device-to-device copy and the bound.

Run by tools/gpu/check.sh under `torchrun --nproc_per_node N`, once with
Shoal's libnccl.so.2 in LD_PRELOAD (device-direct by default: cuda_ipc, stream plans)
and once with PyTorch's own NCCL (NCCL_MULTI_RANK_GPU_ENABLE=1: NCCL 2.30
refuses several ranks per GPU otherwise). N ranks sharing one GPU must read
every input and write every output once, so busbw <= B (N - 1) / N^2, B being
the device copy bandwidth (read + write) measured here first. Prints one line
per collective and size: time, busbw (nccl-tests' definition), and busbw as
a fraction of that bound; and the 8 B AllReduce latency.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


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


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    label = os.environ.get("BENCH_LABEL", "?")
    sizes = [int(s) for s in os.environ.get("BENCH_SIZES", str(1 << 30)).split(",")]
    dist.init_process_group("nccl", device_id=device)
    bound = None
    if rank == 0:
        copy = copy_bandwidth(device, max(sizes))
        bound = copy * (world - 1) / world ** 2
        print(f"[{label}] device copy {max(sizes) >> 20} MiB: {copy / 1e9:.0f} GB/s read+write; "
              f"bound for {world} ranks on one GPU: {bound / 1e9:.0f} GB/s busbw", flush=True)
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
        # The timed rounds reduce their own results again and again: check a fresh one.
        y = torch.full((1024,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(y)
        want = world * (world + 1) / 2
        if not torch.all(y == want):
            print(f"[{label}] rank {rank}: FAIL all_reduce gave {y[0].item()} instead of {want}", flush=True)
            ok = False
    tiny = torch.ones(2, dtype=torch.float32, device=device)
    seconds = timed(lambda: dist.all_reduce(tiny), iters=200, warmup=20)
    if rank == 0:
        print(f"[{label}] all_reduce 8 B latency: {seconds * 1e6:.1f} us", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
