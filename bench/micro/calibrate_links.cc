// calibrate_links: measures the tuner's link costs on this machine.
//
//   calibrate_links [--iters N] [--repeats R]
//
// Per link class (tuner/cost_model.h):
//   loopback  two ranks of one process (ncclCommInitAll), one thread each
//   shm       two forked processes, SHOAL_TRANSPORT=shm
//   net       two forked processes, SHOAL_TRANSPORT=tcp (on one host this is
//             the kernel's loopback path: a floor for alpha, not a NIC's beta)
// it measures, with ncclSend/ncclRecv ping-pong over the public C API:
//   alpha  half the round trip of an 8-byte message, in microseconds
//   beta   (half round trip of a large message - alpha) / its bytes
// and, once for all classes (the same CPU reducer serves every transport):
//   gamma  float sum with the reducer (src/reduce), per byte of the vector,
//          on buffers larger than the caches; the cache-resident rate is
//          printed too (the model's kCacheSpeedup is their ratio).
// Each figure is the median of R repeats of N timed round trips. It prints a
// table, the SHOAL_TUNER_FILE lines and the C++ initialiser lines for
// builtinLinkTable() in src/tuner/cost_model.cc.
//
// Process structure: the parent never calls Shoal; each class runs in fresh
// forked children (rank 0 makes the unique id and hands it to rank 1 through
// a pipe) that report their numbers to the parent through another pipe.
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/types.h"
#include "reduce/reduce.h"
#include "topology/machine.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  int iters = 200;   // round trips per repeat (small messages; large use fewer)
  int repeats = 5;
};

constexpr size_t kSmallBytes = 8;
constexpr size_t kLargeBytes = 16u << 20;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool ok(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return true;
  std::fprintf(stderr, "calibrate_links: %s: %s: %s\n", what, ncclGetErrorString(rc),
               ncclGetLastError(nullptr));
  return false;
}

// Half round trip in microseconds of `bytes`, median over repeats; rank 0
// sends first, rank 1 echoes. Both ranks return the same value only on rank 0.
double pingPongUs(ncclComm_t comm, int rank, size_t bytes, const Settings& s) {
  std::vector<char> buffer(bytes, 1);
  const int peer = 1 - rank;
  const int iters = bytes >= kLargeBytes ? std::max(4, s.iters / 50) : s.iters;
  auto roundTrip = [&] {
    if (rank == 0) {
      ok(ncclSend(buffer.data(), bytes, ncclUint8, peer, comm, nullptr), "ncclSend");
      ok(ncclRecv(buffer.data(), bytes, ncclUint8, peer, comm, nullptr), "ncclRecv");
    } else {
      ok(ncclRecv(buffer.data(), bytes, ncclUint8, peer, comm, nullptr), "ncclRecv");
      ok(ncclSend(buffer.data(), bytes, ncclUint8, peer, comm, nullptr), "ncclSend");
    }
  };
  for (int i = 0; i < std::max(2, iters / 10); ++i) roundTrip();  // connections, caches
  std::vector<double> samples;
  for (int r = 0; r < s.repeats; ++r) {
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) roundTrip();
    samples.push_back(secondsSince(start) * 1e6 / iters / 2);
  }
  return median(samples);
}

struct LinkFigures {
  double alphaUs = 0;
  double betaUsPerByte = 0;
};

LinkFigures measure(ncclComm_t comm, int rank, const Settings& s) {
  LinkFigures f;
  f.alphaUs = pingPongUs(comm, rank, kSmallBytes, s);
  double largeUs = pingPongUs(comm, rank, kLargeBytes, s);
  f.betaUsPerByte = std::max(largeUs - f.alphaUs, 1e-9) / static_cast<double>(kLargeBytes);
  return f;
}

// Two forked processes over `transport`; returns rank 0's figures.
bool measureForked(const char* transport, const Settings& s, LinkFigures* out) {
  int idPipe[2], resultPipe[2];
  if (pipe(idPipe) != 0 || pipe(resultPipe) != 0) return false;
  pid_t children[2] = {-1, -1};
  for (int rank = 0; rank < 2; ++rank) {
    children[rank] = fork();
    if (children[rank] < 0) return false;
    if (children[rank] > 0) continue;
    setenv("SHOAL_TRANSPORT", transport, 1);
    ncclUniqueId id{};
    if (rank == 0) {
      if (!ok(ncclGetUniqueId(&id), "ncclGetUniqueId")) _exit(1);
      if (write(idPipe[1], &id, sizeof id) != sizeof id) _exit(1);
    } else if (read(idPipe[0], &id, sizeof id) != sizeof id) {
      _exit(1);
    }
    ncclComm_t comm = nullptr;
    if (!ok(ncclCommInitRank(&comm, 2, id, rank), "ncclCommInitRank")) _exit(1);
    LinkFigures f = measure(comm, rank, s);
    // Rank 0 hosts the bootstrap root: it waits for rank 1 to finish.
    ok(ncclCommDestroy(comm), "ncclCommDestroy");
    if (rank == 0 && write(resultPipe[1], &f, sizeof f) != sizeof f) _exit(1);
    _exit(0);
  }
  close(idPipe[0]);
  close(idPipe[1]);
  close(resultPipe[1]);
  bool got = read(resultPipe[0], out, sizeof *out) == sizeof *out;
  close(resultPipe[0]);
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    got = got && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return got;
}

// Two ranks of one process, one thread each (run in a forked child so the
// parent stays free of Shoal state).
bool measureLoopback(const Settings& s, LinkFigures* out) {
  int resultPipe[2];
  if (pipe(resultPipe) != 0) return false;
  pid_t child = fork();
  if (child < 0) return false;
  if (child == 0) {
    ncclComm_t comms[2] = {};
    if (!ok(ncclCommInitAll(comms, 2, nullptr), "ncclCommInitAll")) _exit(1);
    LinkFigures f;
    std::thread echo([&] { measure(comms[1], 1, s); });
    f = measure(comms[0], 0, s);
    echo.join();
    for (ncclComm_t c : comms) ok(ncclCommDestroy(c), "ncclCommDestroy");
    if (write(resultPipe[1], &f, sizeof f) != sizeof f) _exit(1);
    _exit(0);
  }
  close(resultPipe[1]);
  bool got = read(resultPipe[0], out, sizeof *out) == sizeof *out;
  close(resultPipe[0]);
  int status = 0;
  waitpid(child, &status, 0);
  return got && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Microseconds per byte of a float sum over vectors of `bytes`.
double reduceUsPerByte(size_t bytes, const Settings& s) {
  const size_t count = bytes / sizeof(float);
  std::vector<float> a(count, 1.0f), b(count, 2.0f), d(count, 0.0f);
  const int iters = std::max<int>(3, static_cast<int>((256u << 20) / bytes));
  shoal::reduce::combine(shoal::ReduceOp::kSum, shoal::DataType::kFloat32, d.data(), a.data(), b.data(), count);
  std::vector<double> samples;
  for (int r = 0; r < s.repeats; ++r) {
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i)
      shoal::reduce::combine(shoal::ReduceOp::kSum, shoal::DataType::kFloat32, d.data(), a.data(), b.data(),
                             count);
    samples.push_back(secondsSince(start) * 1e6 / iters / static_cast<double>(bytes));
  }
  return median(samples);
}

double gbps(double usPerByte) { return usPerByte > 0 ? 1.0 / (usPerByte * 1e3) : 0; }

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iters") == 0) s.iters = std::max(10, std::atoi(argv[i + 1]));
    else if (std::strcmp(argv[i], "--repeats") == 0) s.repeats = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: %s [--iters N] [--repeats R]\n", argv[0]);
      return 2;
    }
  }
  const shoal::MachineTopology machine = [] {
    auto hw = shoal::discoverMachineWithHwloc();
    return hw.isOk() ? hw.value() : shoal::discoverMachineFromSystem();
  }();
  std::printf("# machine: %s (%s); reducer ISA %s\n", shoal::describeMachine(machine).c_str(),
              machine.source.c_str(), shoal::reduce::isaName());

  const double gammaMemory = reduceUsPerByte(64u << 20, s);
  const double gammaCache = reduceUsPerByte(256u << 10, s);

  struct Row {
    const char* linkClass;
    const char* how;
    LinkFigures f;
    bool measured;
  };
  std::vector<Row> rows = {{"loopback", "ncclCommInitAll, 2 threads", {}, false},
                           {"shm", "2 processes, SHOAL_TRANSPORT=shm", {}, false},
                           {"net", "2 processes, SHOAL_TRANSPORT=tcp", {}, false}};
  rows[0].measured = measureLoopback(s, &rows[0].f);
  rows[1].measured = measureForked("shm", s, &rows[1].f);
  rows[2].measured = measureForked("tcp", s, &rows[2].f);

  std::printf("# %-8s %10s %10s %11s  %s\n", "class", "alpha_us", "beta_GBps", "gamma_GBps", "how");
  for (const Row& r : rows) {
    if (!r.measured) {
      std::printf("# %-8s %10s %10s %11s  %s: FAILED\n", r.linkClass, "-", "-", "-", r.how);
      continue;
    }
    std::printf("# %-8s %10.2f %10.3f %11.3f  %s\n", r.linkClass, r.f.alphaUs, gbps(r.f.betaUsPerByte),
                gbps(gammaMemory), r.how);
  }
  std::printf("# reducer: %.3f GB/s on 64 MiB vectors, %.3f GB/s on 256 KiB (cache/memory %.2f)\n",
              gbps(gammaMemory), gbps(gammaCache), gammaMemory / gammaCache);
  std::printf("\n# SHOAL_TUNER_FILE lines: class alpha_us beta_GBps gamma_GBps\n");
  for (const Row& r : rows)
    if (r.measured)
      std::printf("%s %.2f %.3f %.3f\n", r.linkClass, r.f.alphaUs, gbps(r.f.betaUsPerByte), gbps(gammaMemory));
  std::printf("\n// builtinLinkTable() lines (src/tuner/cost_model.cc):\n");
  const char* enumName[] = {"kLoopback", "kShm", "kNet"};
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].measured)
      std::printf("  t[static_cast<size_t>(LinkClass::%s)] = link(%.2f, %.3f, %.3f);\n", enumName[i],
                  rows[i].f.alphaUs, gbps(rows[i].f.betaUsPerByte), gbps(gammaMemory));
  bool all = std::all_of(rows.begin(), rows.end(), [](const Row& r) { return r.measured; });
  return all ? 0 : 1;
}
