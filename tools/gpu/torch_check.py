"""torch.distributed on CUDA tensors through Shoal's libnccl.so.2 (LD_PRELOAD).

Run by tools/gpu/check.sh under `torchrun --nproc_per_node N` with
LD_PRELOAD pointing at Shoal's library. Every rank uses cuda:0 unless more
GPUs exist (Shoal allows several ranks per GPU). Checks all_reduce,
all_gather_into_tensor, reduce_scatter_tensor, broadcast, send/recv and an
async work handle in float32 and bfloat16, with exact expected values, and
prints evidence that Shoal, not NVIDIA's NCCL, served the calls.
"""
import ctypes
import os
import sys
import time

import torch
import torch.distributed as dist


def shoal_evidence():
    """The libnccl.so.2 mapped into this process, and Shoal's own version call."""
    maps = open("/proc/self/maps").read()
    paths = sorted({line.split()[-1] for line in maps.splitlines()
                    if "libnccl" in line and "/" in line})
    lib = ctypes.CDLL("libnccl.so.2")  # the already-loaded one: LD_PRELOAD wins
    try:
        fn = lib.shoalGetVersionString
    except AttributeError:
        return paths, None
    fn.restype = ctypes.c_char_p
    return paths, fn().decode()


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    ngpu = torch.cuda.device_count()
    device = torch.device("cuda", rank % ngpu)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    paths, version = shoal_evidence()
    print(f"rank {rank}/{world} on {device} ({ngpu} GPUs); libnccl mapped: {paths}; "
          f"shoalGetVersionString: {version}; torch reports NCCL {torch.cuda.nccl.version()}",
          flush=True)
    if version is None or any("nvidia/nccl" in p for p in paths):
        print(f"rank {rank}: FAIL: NVIDIA's NCCL served this process, not Shoal", flush=True)
        sys.exit(2)

    failures = []

    def expect(name, got, want):
        if not torch.equal(got, want):
            bad = (got != want).nonzero()
            failures.append(f"{name}: {bad.numel()} wrong, first at {bad[0].tolist()}: "
                            f"{got.flatten()[0].item()} vs {want.flatten()[0].item()}")

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
