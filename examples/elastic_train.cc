// elastic_train: data-parallel training that survives losing a node and
// grows back, with ncclCommShrink and ncclCommGrow (docs/nccl-compat.md,
// "Elastic communicators").
//
// The job starts as 2 emulated nodes x 2 ranks, one process per rank
// (NCCL_HOSTID node0 / node1: shm within a node, tcp between nodes). Every
// rank holds the whole model, takes its rows of each global batch, and the
// ranks sum their gradients with ncclAllReduce, as dp_train does. At step
// --kill-step both ranks of node 1 SIGKILL themselves just before the
// gradient AllReduce, while node 0's ranks are inside it. The survivors see it
// fail, shrink the communicator around node 1's ranks (NCCL_SHRINK_ABORT),
// take rank 0's in-memory state (parameters, Adam moments and step count,
// one ncclBroadcast: a survivor may have finished the step another did not)
// and redo the step on 2 ranks. At step --grow-step, the launcher has started
// two new processes on a fresh node (node2); rank 0 makes a grow id
// (ncclCommGetUniqueId) and hands it to them through a file, every rank calls
// ncclCommGrow, the new ranks receive the state by ncclBroadcast, and
// training goes on with 4 ranks.
//
// Each step's gradient is the sum of every rank's rows scaled by 1/global
// batch, so the run follows the single-process reference (to rounding)
// whatever the number of ranks: --check compares every step's loss and the
// final parameters with it (examples/common/model.h). Rank 0 prints the loss
// curve next to the reference and the time each recovery took.
//
// The scenario is scripted: the survivors know which node was lost because
// the example kills it; a real trainer would take the lost ranks from the
// error (ncclGetLastError names them) or from its launcher. Node 0 must
// survive: rank 0's process made the ncclUniqueId and hosts the bootstrap
// root that the survivors meet in.
//
// With --netns-prefix P every rank process enters the network namespace
// P-n<node> (made by tests/netns/elastic_netns.sh: real veth links to a
// bridge) before it touches NCCL, so that bootstrap and tcp traffic between
// nodes crosses those links; the launcher stays where it was started.
//
// Run: ./elastic_train [--steps 24 --kill-step 8 --grow-step 16] [--check]
//                      [--netns-prefix P]
#include <nccl.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/model.h"
#include "common/options.h"

namespace shoal::examples {
namespace {

constexpr int kRanksPerNode = 2;
constexpr int kFullSize = 4;  // 2 nodes x 2 ranks, before and after the loss
constexpr int kLostNode = 1;

struct ElasticOptions {
  CommonOptions common;
  int killStep = 8;
  int growStep = 16;
  std::string dir;  // where rank 0 leaves the ids for the others
  std::string netnsPrefix;  // empty: every rank stays in the launcher's namespace
};

double nowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

[[noreturn]] void die(int rank, const char* what, ncclResult_t rc) {
  std::printf("elastic_train: rank %d: %s failed: %s: %s\n", rank, what, ncclGetErrorString(rc),
              ncclGetLastError(nullptr));
  std::fflush(stdout);
  _exit(1);
}

#define MUST(rank, call)                                  \
  do {                                                    \
    ncclResult_t must_rc_ = (call);                       \
    if (must_rc_ != ncclSuccess) die((rank), #call, must_rc_); \
  } while (0)

// Small files in the job's directory: the unique ids and the time of death.
void publish(const ElasticOptions& o, const std::string& name, const void* data, size_t n) {
  const std::string path = o.dir + "/" + name, tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, n, f) != n || std::fclose(f) != 0 ||
      std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::printf("elastic_train: cannot write %s\n", path.c_str());
    _exit(1);
  }
}

void await(const ElasticOptions& o, const std::string& name, void* data, size_t n) {
  const std::string path = o.dir + "/" + name;
  for (int i = 0; i < 60000; ++i) {
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      const bool ok = std::fread(data, 1, n, f) == n;
      std::fclose(f);
      if (ok) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::printf("elastic_train: %s never appeared\n", path.c_str());
  _exit(1);
}

// What survives a failure in memory: the model, Adam's moments, the step.
struct State {
  std::vector<float> params, m, v;
  int step = 0;
};

// Everyone takes rank 0's state: after a failure the survivors may be a step
// apart, and new ranks have none.
void shareState(int rank, ncclComm_t comm, State& st) {
  const size_t n = st.params.size();
  std::vector<float> all(3 * n + 1);
  std::copy(st.params.begin(), st.params.end(), all.begin());
  std::copy(st.m.begin(), st.m.end(), all.begin() + static_cast<std::ptrdiff_t>(n));
  std::copy(st.v.begin(), st.v.end(), all.begin() + static_cast<std::ptrdiff_t>(2 * n));
  all[3 * n] = static_cast<float>(st.step);
  MUST(rank, ncclBroadcast(all.data(), all.data(), all.size(), ncclFloat, 0, comm, nullptr));
  std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n), st.params.begin());
  std::copy(all.begin() + static_cast<std::ptrdiff_t>(n), all.begin() + static_cast<std::ptrdiff_t>(2 * n),
            st.m.begin());
  std::copy(all.begin() + static_cast<std::ptrdiff_t>(2 * n), all.begin() + static_cast<std::ptrdiff_t>(3 * n),
            st.v.begin());
  st.step = static_cast<int>(all[3 * n]);
}

// This rank's gradient (scaled by 1 / global batch) and summed loss for its
// rows of the step's global batch.
double localGradient(const ElasticOptions& o, const State& st, int rank, int size, std::vector<float>& grads) {
  const ModelConfig& model = o.common.model;
  const TrainConfig& train = o.common.train;
  const ParamLayout layout = paramLayout(model);
  const int L = model.layers;
  const int first = rank * train.globalBatch / size;
  const int rows = (rank + 1) * train.globalBatch / size - first;
  Batch batch = batchSlice(model, train, st.step, first, rows);
  std::vector<std::vector<float>> act(L + 1);
  act[0] = batch.features;
  for (int l = 0; l < L; ++l) {
    act[l + 1].resize(static_cast<size_t>(rows) * layout.layers[l].out);
    layerForward(model, l, st.params.data() + layout.offsets[l], act[l].data(), rows, act[l + 1].data());
  }
  std::vector<float> dOut(act[L].size());
  const double lossSum = softmaxCrossEntropy(act[L].data(), batch.labels.data(), rows, model.classes,
                                             1.0f / static_cast<float>(train.globalBatch), dOut.data());
  std::fill(grads.begin(), grads.end(), 0.0f);
  for (int l = L - 1; l >= 0; --l) {
    std::vector<float> dIn(l > 0 ? act[l].size() : 0);
    layerBackward(model, l, st.params.data() + layout.offsets[l], act[l].data(), act[l + 1].data(), dOut.data(),
                  rows, grads.data() + layout.offsets[l], l > 0 ? dIn.data() : nullptr);
    dOut = std::move(dIn);
  }
  return lossSum;
}

// One rank's process. `startRank` < kFullSize and `joining` false: one of
// the first four ranks; `joining`: a new rank on node 2 that grows in.
int rankMain(const ElasticOptions& o, int startRank, bool joining) {
  const TrainConfig& train = o.common.train;
  const int node = joining ? 2 : startRank / kRanksPerNode;
  State st;
  st.params = initialParameters(o.common.model);
  st.m.assign(st.params.size(), 0.0f);
  st.v.assign(st.params.size(), 0.0f);
  ncclComm_t comm = nullptr;
  int rank = startRank;
  if (!joining) {
    ncclUniqueId id;
    if (rank == 0) {
      MUST(rank, ncclGetUniqueId(&id));
      publish(o, "id", id.internal, sizeof(id.internal));
    } else {
      await(o, "id", id.internal, sizeof(id.internal));
    }
    MUST(rank, ncclCommInitRank(&comm, kFullSize, id, rank));
  } else {
    ncclUniqueId growId;
    await(o, "grow-id", growId.internal, sizeof(growId.internal));
    MUST(rank, ncclCommGrow(nullptr, kFullSize, &growId, rank, &comm, nullptr));
    shareState(rank, comm, st);
  }
  std::vector<float> grads(st.params.size());
  std::vector<double> losses(static_cast<size_t>(train.steps), 0.0);
  std::vector<int> ranksAt(static_cast<size_t>(train.steps), 0);
  double failedAt = 0, shrinkMs = 0, growStartedAt = 0, growMs = 0;
  double recoveryMs = -1, growRecoveryMs = -1, killedAt = 0;
  bool recovering = false, growing = joining;
  if (joining) growStartedAt = nowMs();
  while (st.step < train.steps) {
    int size = 0;
    MUST(rank, ncclCommCount(comm, &size));
    double lossSum = localGradient(o, st, rank, size, grads);
    if (!joining && node == kLostNode && st.step == o.killStep && size == kFullSize) {
      const double at = nowMs();
      if (rank == kLostNode * kRanksPerNode) publish(o, "killed-at", &at, sizeof(at));
      ::raise(SIGKILL);  // mid-training, while node 0 is inside the AllReduce
    }
    ncclResult_t rc = ncclAllReduce(grads.data(), grads.data(), grads.size(), ncclFloat, ncclSum, comm, nullptr);
    if (rc == ncclSuccess)
      rc = ncclAllReduce(&lossSum, &lossSum, 1, ncclDouble, ncclSum, comm, nullptr);
    if (rc != ncclSuccess) {
      if (recovering || size != kFullSize) die(rank, "a step after the recovery", rc);
      failedAt = nowMs();
      if (rank == 0)
        std::printf("elastic_train: step %d failed on %d ranks: %s\n", st.step, size, ncclGetLastError(nullptr));
      std::vector<int> lost;
      for (int r = kLostNode * kRanksPerNode; r < (kLostNode + 1) * kRanksPerNode; ++r) lost.push_back(r);
      ncclComm_t smaller = nullptr;
      MUST(rank, ncclCommShrink(comm, lost.data(), static_cast<int>(lost.size()), &smaller, nullptr,
                                NCCL_SHRINK_ABORT));
      shrinkMs = nowMs() - failedAt;
      MUST(rank, ncclCommDestroy(comm));
      comm = smaller;
      MUST(rank, ncclCommUserRank(comm, &rank));
      shareState(rank, comm, st);
      recovering = true;
      continue;  // the same step again, on fewer ranks
    }
    adamUpdate(train, st.step + 1, st.params.data(), grads.data(), st.m.data(), st.v.data(), st.params.size());
    losses[static_cast<size_t>(st.step)] = lossSum / train.globalBatch;
    ranksAt[static_cast<size_t>(st.step)] = size;
    ++st.step;
    if (recovering) {
      await(o, "killed-at", &killedAt, sizeof(killedAt));
      recoveryMs = nowMs() - killedAt;
      recovering = false;
    }
    if (growing) {
      growRecoveryMs = nowMs() - growStartedAt;
      growing = false;
    }
    if (st.step == o.growStep && size < kFullSize) {
      // The launcher started node 2's processes when node 1's died; they
      // wait for the id.
      growStartedAt = nowMs();
      ncclUniqueId growId;
      if (rank == 0) {
        MUST(rank, ncclCommGetUniqueId(comm, &growId));
        publish(o, "grow-id", growId.internal, sizeof(growId.internal));
      }
      ncclComm_t bigger = nullptr;
      MUST(rank, ncclCommGrow(comm, kFullSize, rank == 0 ? &growId : nullptr, -1, &bigger, nullptr));
      growMs = nowMs() - growStartedAt;
      MUST(rank, ncclCommDestroy(comm));
      comm = bigger;
      shareState(rank, comm, st);
      growing = true;
    }
  }
  MUST(rank, ncclCommDestroy(comm));
  if (rank != 0) return 0;

  const TrainingRun reference = trainSingleProcess(o.common.model, train);
  std::printf("elastic_train: step  ranks  loss          reference     |difference|\n");
  for (int s = 0; s < train.steps; ++s)
    std::printf("elastic_train: %4d  %5d  %.10f  %.10f  %.1e\n", s, ranksAt[static_cast<size_t>(s)],
                losses[static_cast<size_t>(s)], reference.losses[static_cast<size_t>(s)],
                std::fabs(losses[static_cast<size_t>(s)] - reference.losses[static_cast<size_t>(s)]));
  std::printf("elastic_train: node 1 lost at step %d: death -> failed AllReduce %.0f ms, shrink %.0f ms, "
              "death -> first completed step on 2 ranks %.0f ms\n",
              o.killStep, failedAt - killedAt, shrinkMs, recoveryMs);
  std::printf("elastic_train: grown back to 4 ranks at step %d: grow %.0f ms, grow start -> first completed "
              "step on 4 ranks %.0f ms\n",
              o.growStep, growMs, growRecoveryMs);
  if (o.common.check) {
    TrainingRun run{losses, st.params};
    if (!matchesReference(run, reference, train)) {
      std::printf("elastic_train: MISMATCH with the single-process reference\n");
      return 1;
    }
    std::printf("elastic_train: losses and final parameters match the single-process reference\n");
  }
  return 0;
}

// Moves this (single-threaded, freshly forked) rank process into its node's
// network namespace, as `ip netns exec` would: setns on the name's handle,
// then private mount and UTS namespaces: /sys remounted, so that
// /sys/class/net (read by the topology probe) lists the node's interfaces,
// not the launcher's, and hostname node<K>, as cluster.sh gives its nodes
// (errors then name the node). /tmp and /dev/shm stay shared with the other
// ranks.
void enterNodeNamespace(const ElasticOptions& o, int node) {
  const std::string name = o.netnsPrefix + "-n" + std::to_string(node);
  const std::string path = "/var/run/netns/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
    std::printf("elastic_train: cannot enter network namespace %s: %s\n", name.c_str(), std::strerror(errno));
    _exit(1);
  }
  ::close(fd);
  const std::string host = "node" + std::to_string(node);
  if (::unshare(CLONE_NEWNS | CLONE_NEWUTS) != 0 || ::sethostname(host.c_str(), host.size()) != 0 ||
      ::mount(nullptr, "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0 || ::umount2("/sys", MNT_DETACH) != 0 ||
      ::mount(name.c_str(), "/sys", "sysfs", 0, nullptr) != 0) {
    std::printf("elastic_train: cannot set up node %d's hostname and /sys in network namespace %s: %s\n", node,
                name.c_str(), std::strerror(errno));
    _exit(1);
  }
}

pid_t launch(const ElasticOptions& o, int rank, bool joining) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const int node = joining ? 2 : rank / kRanksPerNode;
  if (!o.netnsPrefix.empty()) enterNodeNamespace(o, node);
  ::setenv("NCCL_HOSTID", ("node" + std::to_string(node)).c_str(), 1);
  const int status = rankMain(o, rank, joining);
  std::fflush(stdout);
  _exit(status);
}

}  // namespace
}  // namespace shoal::examples

int main(int argc, char** argv) {
  using namespace shoal::examples;
  Flags flags(argc, argv);
  ElasticOptions o;
  ModelConfig model;
  o.common = commonOptions(flags, model);
  o.killStep = flags.integer("--kill-step", 8, "step at which node 1's ranks are SIGKILLed");
  o.growStep = flags.integer("--grow-step", 16, "step at which two new ranks on node 2 grow in");
  o.netnsPrefix = flags.text("--netns-prefix", "",
                             "run node K's ranks in network namespace <prefix>-n<K> (tests/netns/elastic_netns.sh)");
  // 24 steps unless --steps says otherwise (the shared default, 8, is too
  // few for a loss, a shrink and a grow). --threads is not used: one rank
  // per process.
  bool stepsGiven = false;
  for (int i = 1; i < argc; ++i) stepsGiven = stepsGiven || std::strncmp(argv[i], "--steps", 7) == 0;
  if (!stepsGiven) o.common.train.steps = 24;
  flags.finish("elastic_train", "data parallel on 2 nodes x 2 ranks that loses node 1, shrinks, and grows back");
  if (!(0 < o.killStep && o.killStep < o.growStep && o.growStep < o.common.train.steps)) {
    std::fprintf(stderr, "need 0 < --kill-step < --grow-step < --steps\n");
    return 2;
  }
  // Under $TMPDIR when set: a harness that may end the run gives it a
  // folder it removes itself.
  const char* tmp = std::getenv("TMPDIR");
  std::string dirTemplate = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/shoal-elastic-train-XXXXXX";
  if (::mkdtemp(dirTemplate.data()) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  o.dir = dirTemplate;
  // The launcher never calls NCCL: each rank is a fresh process of its own.
  std::vector<pid_t> original;
  for (int r = 0; r < kFullSize; ++r) original.push_back(launch(o, r, false));
  int failures = 0, killed = 0;
  std::vector<pid_t> joined;
  auto reap = [&](pid_t pid, bool mayBeKilled) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && mayBeKilled) {
      ++killed;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
    }
  };
  // Node 1's ranks die first; their replacements start once they have.
  for (int r = kLostNode * kRanksPerNode; r < (kLostNode + 1) * kRanksPerNode; ++r) reap(original[r], true);
  for (int r = kLostNode * kRanksPerNode; r < (kLostNode + 1) * kRanksPerNode; ++r)
    joined.push_back(launch(o, r, true));
  for (int r = 0; r < kRanksPerNode; ++r) reap(original[r], false);
  for (pid_t pid : joined) reap(pid, false);
  for (const char* name : {"id", "grow-id", "killed-at"}) ::unlink((o.dir + "/" + name).c_str());
  ::rmdir(o.dir.c_str());
  std::printf("elastic_train: %d ranks killed as planned, %d processes failed\n", killed, failures);
  return failures == 0 && killed == kRanksPerNode ? 0 : 1;
}
