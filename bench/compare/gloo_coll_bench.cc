// Gloo's AllReduce / AllGather / ReduceScatter (float sum) under the
// nccl-tests conventions of coll_common.h, for bench/compare. TCP device on
// 127.0.0.1, or on the interface named by GLOO_SOCKET_IFNAME (PyTorch's
// variable; net_compare.sh sets it to the emulated node's link), FileStore
// rendezvous in --store DIR (or $GLOO_STORE_DIR; a fresh,
// empty folder per launch, shared by all ranks).
//
//   RANK=0 SIZE=2 gloo_coll_bench --store /tmp/s -o allreduce -A ring &
//   RANK=1 SIZE=2 gloo_coll_bench --store /tmp/s -o allreduce -A ring
//   mpirun -np 2 gloo_coll_bench --store /tmp/s ...   (rank and size from
//       OMPI_COMM_WORLD_RANK/SIZE; MPI itself is not used)
//
// -A picks the algorithm:
//   allreduce       ring (gloo::AllreduceRing, in place; default)
//                   hd   (gloo::AllreduceHalvingDoubling, in place)
//                   api  (gloo::allreduce, unbound buffers, out of place)
//   allgather       ring (gloo::AllgatherRing, out of place; default)
//                   api  (gloo::allgather, out of place)
//   reduce_scatter  hd   (gloo::ReduceScatterHalvingDoubling, in place; the
//                   rank's block ends up at the start of the buffer; default)
// In-place algorithms are reported in the in-place columns only (their
// out-of-place columns read N/A). Per size: `-w` untimed calls, a barrier,
// `-n` timed calls, per-rank time per call combined over ranks (mean with
// -a 1, max with -a 3), then one checked call on fresh inputs.
//
// Note: Gloo's tcp pair sizes SO_SNDBUF from the first
// message it sends; --prime runs one 64 MiB allreduce first to avoid the small
// send buffer that a small first message leaves (off by default, as an
// application would run).
#include <gloo/algorithm.h>
#include <gloo/allgather.h>
#include <gloo/allgather_ring.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <functional>
#include <memory>

#include "coll_common.h"

using namespace compare;
using Clock = std::chrono::steady_clock;

namespace {

int envInt(const char* a, const char* b, int fallback) {
  for (const char* name : {a, b}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return fallback;
}

// One collective on fixed buffers: `run` performs it (the algorithm object
// is built once per size, outside the timed region).
struct Bench {
  std::function<void()> run;
  bool inPlace = false;
  float* result = nullptr;  // where this rank's output is after `run`
};

void sumFloats(void* c, const void* a, const void* b, size_t n) { gloo::sum<float>(c, a, b, n); }

Bench makeBench(const std::shared_ptr<gloo::Context>& ctx, Op op, const std::string& algo,
                const Shape& s, float* send, float* recv, int nranks,
                std::shared_ptr<gloo::Algorithm>* holder) {
  Bench b;
  const int count = static_cast<int>(s.count);
  switch (op) {
    case Op::kAllReduce:
      if (algo == "ring" || algo == "hd") {
        if (algo == "ring") {
          *holder = std::make_shared<gloo::AllreduceRing<float>>(ctx, std::vector<float*>{send},
                                                                 count);
        } else {
          *holder = std::make_shared<gloo::AllreduceHalvingDoubling<float>>(
              ctx, std::vector<float*>{send}, count);
        }
        b.run = [h = *holder] { h->run(); };
        b.inPlace = true;
        b.result = send;
      } else {  // api
        b.run = [ctx, send, recv, s] {
          gloo::AllreduceOptions opts(ctx);
          opts.setInput(send, s.count);
          opts.setOutput(recv, s.count);
          opts.setReduceFunction(gloo::AllreduceOptions::Func(&sumFloats));
          gloo::allreduce(opts);
        };
        b.result = recv;
      }
      break;
    case Op::kAllGather:
      if (algo == "ring") {
        *holder = std::make_shared<gloo::AllgatherRing<float>>(
            ctx, std::vector<const float*>{send}, recv, count);
        b.run = [h = *holder] { h->run(); };
      } else {  // api
        b.run = [ctx, send, recv, s] {
          gloo::AllgatherOptions opts(ctx);
          opts.setInput(send, s.sendCount);
          opts.setOutput(recv, s.recvCount);
          gloo::allgather(opts);
        };
      }
      b.result = recv;
      break;
    case Op::kReduceScatter: {
      *holder = std::make_shared<gloo::ReduceScatterHalvingDoubling<float>>(
          ctx, std::vector<float*>{send}, static_cast<int>(s.sendCount),
          std::vector<int>(static_cast<size_t>(nranks), count));
      b.run = [h = *holder] { h->run(); };
      b.inPlace = true;
      b.result = send;
      break;
    }
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parseOptions(argc, argv, &o,
                    "[-A ring|hd|api] [--store DIR] [--prime]   (RANK/SIZE or OMPI_COMM_WORLD_*)")) {
    return 2;
  }
  if (o.algo.empty()) o.algo = o.op == Op::kReduceScatter ? "hd" : "ring";
  const bool algoOk = (o.op == Op::kAllReduce && (o.algo == "ring" || o.algo == "hd" || o.algo == "api")) ||
                      (o.op == Op::kAllGather && (o.algo == "ring" || o.algo == "api")) ||
                      (o.op == Op::kReduceScatter && o.algo == "hd");
  if (!algoOk) {
    std::fprintf(stderr, "-A %s is not available for %s (see the top of gloo_coll_bench.cc)\n",
                 o.algo.c_str(), opName(o.op));
    return 2;
  }
  if (o.storeDir.empty()) {
    if (const char* d = std::getenv("GLOO_STORE_DIR")) o.storeDir = d;
  }
  const int rank = envInt("RANK", "OMPI_COMM_WORLD_RANK", -1);
  const int nranks = envInt("SIZE", "OMPI_COMM_WORLD_SIZE", envInt("WORLD_SIZE", "WORLD_SIZE", -1));
  if (rank < 0 || nranks < 1 || rank >= nranks || o.storeDir.empty()) {
    std::fprintf(stderr, "need RANK and SIZE (or OMPI_COMM_WORLD_RANK/SIZE) and --store DIR\n");
    return 2;
  }

  gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr && *iface != '\0') {
    attr.iface = iface;
  } else {
    attr.hostname = "127.0.0.1";  // loopback unless told otherwise
  }
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
  ctx->setTimeout(std::chrono::seconds(600));
  gloo::rendezvous::FileStore store(o.storeDir);
  ctx->connectFullMesh(store, dev);
  std::shared_ptr<gloo::Context> base = ctx;

  const std::vector<size_t> sizes = sweep(o);
  const Shape largest = shapeFor(o.op, sizes.back(), nranks);
  float* send = static_cast<float*>(allocPages(largest.sendCount * sizeof(float)));
  float* recv = static_cast<float*>(allocPages(largest.recvCount * sizeof(float)));

  gloo::BarrierAllToAll barrier(base);
  double sums[2] = {0, 0};  // time, wrong
  gloo::AllreduceRing<double> sumAll(base, {sums}, 2);
  gloo::AllreduceRing<double> maxAll(base, {sums}, 1, gloo::ReductionFunction<double>::max);

  if (o.prime) {
    const size_t n = (64u << 20) / sizeof(float);
    std::vector<float> tmp(n, 1.0f);
    gloo::AllreduceRing<float>(base, {tmp.data()}, static_cast<int>(n)).run();
  }

  const std::string lib = "Gloo " + o.algo;
  Report report(o, "gloo_coll_bench", nranks, lib);
  if (rank == 0) report.header();

  for (size_t size : sizes) {
    const Shape s = shapeFor(o.op, size, nranks);
    if (s.count == 0) continue;
    fillInput(send, s.sendCount, rank);
    std::shared_ptr<gloo::Algorithm> holder;
    Bench b = makeBench(base, o.op, o.algo, s, send, recv, nranks, &holder);

    // In-place algorithms keep summing into the input while timing; the
    // values grow (possibly to inf), which costs the same as any other float.
    for (int w = 0; w < o.warmup; ++w) b.run();
    barrier.run();
    const auto start = Clock::now();
    for (int i = 0; i < o.iters; ++i) b.run();
    const double mine = std::chrono::duration<double>(Clock::now() - start).count() / o.iters;
    sums[0] = mine;
    double combined = 0;
    if (o.average == 3) {
      maxAll.run();
      combined = sums[0];
    } else {
      sums[1] = 0;
      sumAll.run();
      combined = sums[0] / nranks;
    }

    int64_t wrong = -1;
    if (o.check) {
      fillInput(send, s.sendCount, rank);
      std::memset(recv, 0, s.recvCount * sizeof(float));
      barrier.run();  // a faster neighbour would otherwise write into recv before the memset
      b.run();
      sums[0] = 0;
      sums[1] = static_cast<double>(countWrong(o.op, s, b.result, rank, nranks));
      sumAll.run();
      wrong = static_cast<int64_t>(sums[1]);
    }
    const Measurement m = measurement(o.op, s, nranks, combined, wrong);
    if (rank == 0) {
      if (b.inPlace) report.row(s, std::nullopt, m);
      else report.row(s, m, std::nullopt);
    }
    holder.reset();
    barrier.run();
  }

  int status = 0;
  if (rank == 0) status = report.finish();
  std::free(send);
  std::free(recv);
  return status;
}
