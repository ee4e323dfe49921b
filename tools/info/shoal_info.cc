// shoal-info: what Shoal will do on this machine, before a job runs.
//
//   shoal-info [--ranks N] [--nodes M] [--json]
//
// Prints the version and build options, the machine's topology, the
// interfaces NCCL_SOCKET_IFNAME selects, libfabric's providers and the one the
// ofi transport would take, the shared-memory limits, every parameter with its
// value and where it came from, the NCCL variables set that Shoal does not
// honour, and, for a layout of N ranks over M nodes (one process per rank, as
// under mpirun), the transport between ranks and the tuner's choice of
// algorithm, channels and segment per collective and size.
//
// Everything comes from the library's own code, linked in from shoal_static:
// machine discovery (src/topology), the parameter registry (src/core),
// interface selection (src/net), the transport registry and the tuner, fed a
// topology built from this process's own PeerInfo as a communicator builds
// it (docs/architecture.md, "Around the library", says why a tool may link
// the internals).
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "collectives/registry.h"
#include "core/params.h"
#include "core/peer_info.h"
#include "core/process.h"
#include "core/types.h"
#include "memory/shared_memory.h"
#include "net/interfaces.h"
#include "topology/machine.h"
#include "topology/topology.h"
#include "transports/ofi/ofi_transport.h"
#include "transports/registry.h"
#include "tuner/tuner.h"

namespace shoal {
namespace {

// A minimal JSON value: enough to print what this tool knows, in order.
class Json {
 public:
  static Json object() { return Json('{'); }
  static Json array() { return Json('['); }
  static std::string quote(const std::string& s) {
    std::string out = "\"";
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
      else if (c == '\n') out += "\\n";
      else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
      } else out += static_cast<char>(c);
    }
    return out + "\"";
  }
  Json& raw(const std::string& key, const std::string& text) {
    body_ += (body_.empty() ? "" : ",") + (open_ == '{' ? quote(key) + ":" : "") + text;
    return *this;
  }
  Json& set(const std::string& key, const std::string& v) { return raw(key, quote(v)); }
  Json& set(const std::string& key, const char* v) { return raw(key, quote(v)); }
  Json& set(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  Json& set(const std::string& key, int64_t v) { return raw(key, std::to_string(v)); }
  Json& set(const std::string& key, int v) { return raw(key, std::to_string(v)); }
  Json& set(const std::string& key, uint64_t v) { return raw(key, std::to_string(v)); }
  Json& set(const std::string& key, const Json& v) { return raw(key, v.text()); }
  Json& add(const Json& v) { return raw("", v.text()); }
  Json& add(const std::string& v) { return raw("", quote(v)); }
  std::string text() const { return std::string(1, open_) + body_ + (open_ == '{' ? "}" : "]"); }

 private:
  explicit Json(char open) : open_(open) {}
  char open_;
  std::string body_;
};

std::string bytesText(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(b);
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), v == std::floor(v) ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string readFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return line;
}

struct Options {
  int ranks = 0;  // 0: this machine's cores
  int nodes = 1;
  bool json = false;
};

// ---------------------------------------------------------------- build

Json buildInfo() {
  Json j = Json::object();
  j.set("shoal", SHOAL_VERSION_STRING);
  j.set("nccl_api", std::to_string(SHOAL_NCCL_VERSION_CODE / 10000) + "." +
                        std::to_string(SHOAL_NCCL_VERSION_CODE / 100 % 100) + "." +
                        std::to_string(SHOAL_NCCL_VERSION_CODE % 100));
  j.set("nccl_version_code", static_cast<int64_t>(SHOAL_NCCL_VERSION_CODE));
  j.set("build_type", SHOAL_INFO_BUILD_TYPE);
  j.set("cuda", static_cast<bool>(SHOAL_INFO_WITH_CUDA));
  j.set("hwloc", static_cast<bool>(SHOAL_INFO_WITH_HWLOC));
  j.set("libfabric", static_cast<bool>(SHOAL_INFO_WITH_LIBFABRIC));
  j.set("compiler", __VERSION__);
  return j;
}

// ---------------------------------------------------------------- machine

Json machineInfo(const MachineTopology& m) {
  Json j = Json::object();
  j.set("source", m.source);
  j.set("packages", m.packages);
  j.set("cores", m.cores);
  j.set("numa_nodes", m.numaNodes);
  j.set("l2_bytes", m.l2Bytes);
  j.set("l3_bytes", m.l3Bytes);
  j.set("l3_count", m.l3Count);
  Json nics = Json::array();
  for (const auto& n : m.nics) nics.add(n);
  j.set("nics", nics);
  j.set("gpus", m.gpus);
  j.set("summary", describeMachine(m));
  return j;
}

// ---------------------------------------------------------------- interfaces

struct InterfaceReport {
  Json json = Json::object();
  std::string text;
};

InterfaceReport interfaceInfo() {
  InterfaceReport r;
  const Params& p = params();
  r.json.set("NCCL_SOCKET_IFNAME", p.socketIfname);
  r.json.set("NCCL_SOCKET_FAMILY", p.socketFamily);
  r.text += "  NCCL_SOCKET_IFNAME=" + (p.socketIfname.empty() ? std::string("(unset: any but lo and docker*, else lo)") : p.socketIfname) +
            (p.socketFamily.empty() ? "" : "  NCCL_SOCKET_FAMILY=" + p.socketFamily) + "\n";
  auto all = net::listInterfaces();
  if (!all.isOk()) {
    r.json.set("error", all.status().message());
    r.text += "  cannot list interfaces: " + all.status().message() + "\n";
    return r;
  }
  auto candidates = net::selectInterfaces(all.value(), p.socketIfname, p.socketFamily);
  Json list = Json::array();
  for (const auto& i : all.value()) {
    int order = -1;
    if (candidates.isOk())
      for (size_t k = 0; k < candidates.value().size(); ++k)
        if (candidates.value()[k].name == i.name && candidates.value()[k].address.toString() == i.address.toString())
          order = static_cast<int>(k);
    Json e = Json::object();
    e.set("name", i.name).set("address", i.address.hostString()).set("up", i.up).set("loopback", i.loopback);
    e.set("candidate", order);
    list.add(e);
    char line[160];
    std::snprintf(line, sizeof(line), "  %-12s %-40s %s%s\n", i.name.c_str(), i.address.hostString().c_str(),
                  i.up ? "up" : "down",
                  order == 0 ? "   <- used" : order > 0 ? ("   candidate " + std::to_string(order + 1)).c_str() : "");
    r.text += line;
  }
  r.json.set("interfaces", list);
  auto chosen = net::chooseInterface();
  if (chosen.isOk()) {
    r.json.set("selected", chosen.value().name);
    r.json.set("selected_address", chosen.value().address.hostString());
    r.text += "  selected: " + chosen.value().name + " (" + chosen.value().address.hostString() +
              "): the bootstrap root and the tcp transport listen here\n";
  } else {
    r.json.set("selected", "");
    r.json.set("error", chosen.status().message());
    r.text += "  selected: none: " + chosen.status().message() + "\n";
  }
  return r;
}

// ---------------------------------------------------------------- libfabric

InterfaceReport providerInfo() {
  InterfaceReport r;
  ofi::ProviderSurvey s = ofi::surveyProviders();
  r.json.set("library", s.library);
  Json list = Json::array();
  for (const auto& p : s.providers) {
    Json domains = Json::array();
    std::string domainText;
    for (const auto& d : p.domains) {
      domains.add(d);
      domainText += (domainText.empty() ? "" : ", ") + d;
    }
    list.add(Json::object().set("name", p.name).set("domains", domains).set("over_sockets", p.overSockets));
    r.text += "  " + p.name + (p.overSockets ? " (over kernel sockets)" : "") + ": " + domainText + "\n";
  }
  r.json.set("providers", list);
  r.json.set("chosen", s.chosen);
  r.json.set("chosen_between_hosts_by_default", s.chosenByDefault);
  r.json.set("started", s.requested);
  if (!s.error.empty()) r.json.set("error", s.error);
  if (!s.library.empty()) r.text = "  " + s.library + "\n" + r.text;
  if (!s.error.empty()) r.text += "  none usable: " + s.error + "\n";
  if (!s.chosen.empty())
    r.text += "  the ofi transport would take: " + s.chosen +
              (s.chosenByDefault ? " (a hardware provider: used between hosts unless NCCL_NET=Socket)"
                                 : " (over sockets: used only with NCCL_NET=Libfabric, ncclConfig_t.netName=Libfabric or "
                                   "SHOAL_TRANSPORT=ofi; "
                                   "tcp serves between hosts otherwise)") +
              "\n";
  if (!s.requested)
    r.text += "  (libfabric starts in a job only with FI_PROVIDER, NCCL_NET=Libfabric or SHOAL_TRANSPORT=ofi set, "
              "or for a communicator whose ncclConfig_t.netName is Libfabric)\n";
  return r;
}

// ---------------------------------------------------------------- shared memory

// Whether a process that is not this one's ancestor may read its memory with
// process_vm_readv, as a shm peer does: a forked child reads the parent (under
// Yama ptrace_scope 1 that is refused, as between ranks started by mpirun).
bool peerMayReadMe(std::string& why) {
  static volatile uint64_t secret = 0x5ca1ab1e5ca1ab1eull;
  pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) {
    why = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  if (child == 0) {
    uint64_t got = 0;
    iovec local{&got, sizeof(got)};
    iovec remote{const_cast<uint64_t*>(&secret), sizeof(got)};
    ssize_t n = process_vm_readv(parent, &local, 1, &remote, 1, 0);
    _exit(n == static_cast<ssize_t>(sizeof(got)) && got == secret ? 0 : (errno == EPERM ? 2 : 3));
  }
  int status = 0;
  waitpid(child, &status, 0);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 4;
  if (code == 2) why = "process_vm_readv: EPERM (ptrace permission)";
  else if (code != 0) why = "process_vm_readv failed";
  return code == 0;
}

InterfaceReport sharedMemoryInfo() {
  InterfaceReport r;
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) == 0) {
    uint64_t size = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
    uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    r.json.set("dev_shm_bytes", size).set("dev_shm_free_bytes", avail);
    r.text += "  /dev/shm: " + bytesText(size) + " (" + bytesText(avail) + " free)\n";
  } else {
    r.json.set("dev_shm_bytes", static_cast<uint64_t>(0));
    r.text += std::string("  /dev/shm: not available (") + std::strerror(errno) + "): shm cannot run\n";
  }
  std::string scope = readFirstLine("/proc/sys/kernel/yama/ptrace_scope");
  r.json.set("ptrace_scope", scope.empty() ? int64_t{-1} : static_cast<int64_t>(std::atoi(scope.c_str())));
  std::string why;
  bool peerReads = peerMayReadMe(why);
  r.json.set("peer_may_read", peerReads);
  bool pays = memory::remoteReadsPay();
  r.json.set("single_copy_reads_pay", pays);
  r.json.set("SHOAL_SHM_CMA", params().shmCma);
  r.text += "  Yama ptrace_scope: " + (scope.empty() ? std::string("(no Yama)") : scope) +
            "; another process reading this one's memory (process_vm_readv): " +
            (peerReads ? std::string("allowed") : "refused, " + why) + "\n";
  r.text += std::string("  single-copy reads: ") +
            (!params().shmCma ? "off (SHOAL_SHM_CMA=0)"
             : pays           ? "used for shm messages >= 64 KiB (reads run at >= 60 % of memcpy here)"
                              : "not used (too slow or not allowed here): shm copies through its rings") +
            "\n";
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
    r.json.set("memlock_bytes", lim.rlim_cur == RLIM_INFINITY ? int64_t{-1} : static_cast<int64_t>(lim.rlim_cur));
    r.text += "  locked memory limit (pinned staging, libfabric registration): " +
              (lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : bytesText(lim.rlim_cur)) + "\n";
  }
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    r.json.set("open_files", lim.rlim_cur == RLIM_INFINITY ? int64_t{-1} : static_cast<int64_t>(lim.rlim_cur));
    r.text += "  open files limit (sockets per peer): " +
              (lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : std::to_string(lim.rlim_cur)) + "\n";
  }
  return r;
}

// ---------------------------------------------------------------- parameters

InterfaceReport parameterInfo() {
  InterfaceReport r;
  Json list = Json::array();
  for (const auto& p : describeParams()) {
    std::string def = p.defaultValue;
    if (def.size() >= 2 && def.front() == '"') def = def.substr(1, def.size() - 2);
    std::string value = p.isSet ? p.value : def;
    list.add(Json::object().set("name", p.env).set("value", value).set("default", def).set("source", p.source));
    char line[512];
    std::snprintf(line, sizeof(line), "  %-34s %-22s %s\n", p.env, value.empty() ? "(unset)" : value.c_str(),
                  p.source.c_str());
    r.text += line;
  }
  r.json.set("parameters", list);
  Json ignored = Json::array();
  std::string ignoredText;
  for (const auto& u : describeUnhonoured()) {
    if (!u.isSet) continue;
    ignored.add(Json::object()
                    .set("name", u.env)
                    .set("value", u.value)
                    .set("source", u.source)
                    .set("level", u.warn ? "WARN" : "INFO")
                    .set("reason", u.reason));
    ignoredText += std::string("  ") + (u.warn ? "WARN " : "INFO ") + u.env + "=" + u.value + ": " + u.reason + "\n";
  }
  r.json.set("unhonoured", ignored);
  r.text += "\nNCCL variables set that Shoal does not honour:\n" + (ignoredText.empty() ? "  none\n" : ignoredText);
  return r;
}

// ---------------------------------------------------------------- layout

// This process's PeerInfo as a communicator makes it, then one like it per
// rank of the layout: ranks of node 0 are other processes of this host,
// ranks of node n > 0 processes of another host that publish the same
// transports (the layout assumes one build and one set of variables).
std::vector<PeerInfo> layoutPeers(int ranks, int nodes, std::string& note) {
  PeerInfo self;
  self.rank = 0;
  self.hostname = localHostname();
  self.hostId = localHostId();
  self.processId = localProcessId();
  self.kernelId = localKernelId();
  if (Status st = publishAddresses(self, TransportChoice{}); !st.isOk()) note = st.message();
  int perNode = (ranks + nodes - 1) / nodes;
  std::vector<PeerInfo> peers;
  for (int r = 0; r < ranks; ++r) {
    PeerInfo p = self;
    p.rank = r;
    int node = std::min(r / perNode, nodes - 1);
    if (node > 0) {
      p.hostname = "node" + std::to_string(node);
      p.hostId = self.hostId + "#layout-node" + std::to_string(node);
      p.kernelId = self.kernelId + "#layout-node" + std::to_string(node);
    }
    if (r > 0) p.processId = self.processId + static_cast<uint64_t>(r);
    peers.push_back(std::move(p));
  }
  return peers;
}

struct LayoutReport {
  Json json = Json::object();
  std::string text;
  bool ok = true;
};

LayoutReport layoutInfo(const Options& o) {
  LayoutReport r;
  std::string note;
  std::vector<PeerInfo> peers = layoutPeers(o.ranks, o.nodes, note);
  Topology topo = buildTopology(peers);
  r.json.set("ranks", o.ranks).set("nodes", static_cast<int>(topo.nodes.size()));
  r.json.set("ranks_per_node", topo.maxRanksPerNode());
  r.text += "  " + std::to_string(o.ranks) + " ranks on " + std::to_string(topo.nodes.size()) +
            " node(s), up to " + std::to_string(topo.maxRanksPerNode()) +
            " per node, one process per rank (as under mpirun)\n";
  if (!note.empty()) r.text += "  note: " + note + "\n";

  // Transports as the registry picks them for rank 0's peers (host memory:
  // the layout's ranks have no GPU, so none is device-direct).
  auto transportName = [&](int a, int b) -> std::string {
    Result<Transport*> t = selectTransport(peers[a], peers[b], TransportChoice{});
    return t.isOk() ? std::string(t.value()->name()) : "error: " + t.status().message();
  };
  Json transports = Json::object();
  if (topo.nodeOf(0).size() > 1) {
    std::string t = transportName(0, topo.nodeOf(0)[1]);
    transports.set("inside_node", t);
    r.text += "  inside a node: " + t + "\n";
  }
  if (topo.leaders.size() > 1) {
    std::string t = transportName(0, topo.leaders[1]);
    transports.set("between_nodes", t);
    r.text += "  between nodes: " + t + "\n";
  }
  r.json.set("transports", transports);

  // The summary and the rank view exactly as Communicator::init builds them.
  bool readsAll = true;
  for (int peer = 1; peer < o.ranks && readsAll; ++peer) {
    auto chosen = selectTransport(peers[0], peers[peer], TransportChoice{});
    readsAll = chosen.isOk() && chosen.value()->readsPeerMemory(peers[peer]);
  }
  auto classify = [&](int a, int b) {
    Result<Transport*> t = selectTransport(peers[a], peers[b], TransportChoice{});
    return t.isOk() ? t.value()->linkClass() : LinkClass::kNet;
  };
  TopologySummary summary = summarizeTopology(topo, classify, /*singleProcess=*/o.ranks == 1, localMachine());
  if (topo.leaders.size() > 1)
    if (Result<Transport*> t = selectTransport(peers[topo.leaders[0]], peers[topo.leaders[1]], TransportChoice{}); t.isOk()) {
      summary.netTransport = std::string(t.value()->name());
      summary.netCpuCopies = t.value()->cpuCopiesBytes();
      summary.netEmulatedOverSockets = t.value()->emulatesMessagesOverSockets();
    }
  auto tuner = Tuner::create(summary, 0, 0);
  if (!tuner.isOk()) {
    r.ok = false;
    r.json.set("error", tuner.status().message());
    r.text += "  tuner: " + tuner.status().message() + "\n";
    return r;
  }
  RankView view;
  view.rank = 0;
  view.nranks = o.ranks;
  view.ring = topo.ring;
  view.nodeOf = topo.nodeOfRank;
  view.peerReads = readsAll;
  view.ranksTakeTurns = tuner.value()->ranksTakeTurns();
  r.json.set("peer_reads", readsAll).set("ranks_take_turns", view.ranksTakeTurns);
  if (view.ranksTakeTurns)
    r.text += "  more ranks per node than cores: they take turns on the cores\n";

  // One decision per collective and power-of-two size bucket (the buckets
  // the tuner logs at INFO TUNING), from 8 B to 1 GiB.
  const CollKind kinds[] = {CollKind::kAllReduce, CollKind::kAllGather, CollKind::kReduceScatter,
                            CollKind::kBroadcast, CollKind::kReduce, CollKind::kAllToAll};
  Json table = Json::array();
  r.text += "\n  tuner's choice (bytes per rank as NCCL counts them; algorithm x channels, segment):\n";
  for (CollKind kind : kinds) {
    r.text += std::string("  ") + collKindName(kind) + "\n";
    std::string runText, runStart, runEnd;
    auto flush = [&] {
      if (runText.empty()) return;
      char line[200];
      std::snprintf(line, sizeof(line), "    %9s .. %-9s %s\n", runStart.c_str(), runEnd.c_str(), runText.c_str());
      r.text += line;
    };
    for (uint64_t bytes = 8; bytes <= (1ull << 30); bytes <<= 1) {
      CollShape shape;
      shape.kind = kind;
      shape.dtype = DataType::kUint8;
      shape.count = bytes;
      shape.disjointBuffers = true;
      if (kind == CollKind::kBroadcast || kind == CollKind::kReduce) shape.root = 0;
      Json row = Json::object();
      row.set("collective", collKindName(kind)).set("bytes", bytes);
      std::string choiceText;
      auto choice = tuner.value()->choose(shape, view);
      if (choice.isOk()) {
        const TunerChoice& c = choice.value();
        auto us = tuner.value()->estimateUs(shape, view);
        row.set("algorithm", c.algorithm->name).set("channels", c.params.channels);
        row.set("segment_bytes", static_cast<uint64_t>(c.params.segmentBytes));
        if (us.isOk()) row.raw("estimate_us", std::to_string(us.value()));
        choiceText = std::string(c.algorithm->name) + " x" + std::to_string(c.params.channels) + ", " +
                     bytesText(c.params.segmentBytes);
      } else {
        row.set("error", choice.status().message());
        choiceText = "error: " + choice.status().message();
      }
      table.add(row);
      if (choiceText != runText) {
        flush();
        runText = choiceText;
        runStart = bytesText(bytes);
      }
      runEnd = bytesText(bytes);
    }
    flush();
  }
  r.json.set("tuner", table);
  return r;
}

void usage(FILE* out) {
  std::fputs(
      "usage: shoal-info [--ranks N] [--nodes M] [--json]\n"
      "  What Shoal will use on this machine: version and build, topology, the interface\n"
      "  NCCL_SOCKET_IFNAME selects, libfabric providers, shared-memory limits, every\n"
      "  parameter and where its value came from, NCCL variables it ignores, and the\n"
      "  transports and tuner decisions for N ranks over M nodes (default: one rank per\n"
      "  core, one node).\n"
      "  --json   one JSON object on stdout, for tools\n",
      out);
}

// Parses a positive int, or says why not.
std::optional<int> positive(const char* flag, const char* text) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < 1 || v > 1 << 20) {
    std::fprintf(stderr, "shoal-info: %s wants a positive integer, got '%s'\n", flag, text);
    return std::nullopt;
  }
  return static_cast<int>(v);
}

int run(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      o.json = true;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "--version") {
      std::printf("shoal-info %s (NCCL %d API)\n", SHOAL_VERSION_STRING, SHOAL_NCCL_VERSION_CODE);
      return 0;
    } else if ((a == "--ranks" || a == "--nodes") && i + 1 < argc) {
      auto v = positive(a.c_str(), argv[++i]);
      if (!v) return 2;
      (a == "--ranks" ? o.ranks : o.nodes) = *v;
    } else {
      std::fprintf(stderr, "shoal-info: unknown argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  const MachineTopology& machine = localMachine();
  if (o.ranks == 0) o.ranks = std::max(machine.cores, o.nodes);
  if (o.nodes > o.ranks) {
    std::fprintf(stderr, "shoal-info: --nodes %d needs at least as many ranks (--ranks %d)\n", o.nodes, o.ranks);
    return 2;
  }
  InterfaceReport interfaces = interfaceInfo();
  InterfaceReport providers = providerInfo();
  InterfaceReport shm = sharedMemoryInfo();
  InterfaceReport parameters = parameterInfo();
  LayoutReport layout = layoutInfo(o);
  if (o.json) {
    Json j = Json::object();
    j.set("build", buildInfo());
    j.set("machine", machineInfo(machine));
    j.set("network", interfaces.json);
    j.set("libfabric", providers.json);
    j.set("shared_memory", shm.json);
    j.set("environment", parameters.json);
    j.set("layout", layout.json);
    std::printf("%s\n", j.text().c_str());
  } else {
    std::printf("Shoal %s, NCCL %d.%d.%d API (libnccl.so.2); build %s, CUDA %s, hwloc %s, libfabric %s\n",
                SHOAL_VERSION_STRING, SHOAL_NCCL_VERSION_CODE / 10000, SHOAL_NCCL_VERSION_CODE / 100 % 100,
                SHOAL_NCCL_VERSION_CODE % 100, SHOAL_INFO_BUILD_TYPE, SHOAL_INFO_WITH_CUDA ? "yes" : "no",
                SHOAL_INFO_WITH_HWLOC ? "yes" : "no", SHOAL_INFO_WITH_LIBFABRIC ? "yes (loaded at run time)" : "no");
    std::printf("\nMachine (%s):\n  %s\n", machine.source.c_str(), describeMachine(machine).c_str());
    std::printf("\nNetwork interfaces:\n%s", interfaces.text.c_str());
    std::printf("\nlibfabric providers:\n%s", providers.text.c_str());
    std::printf("\nShared memory:\n%s", shm.text.c_str());
    std::printf("\nParameters (value, where it came from):\n%s", parameters.text.c_str());
    std::printf("\nLayout:\n%s", layout.text.c_str());
  }
  return layout.ok ? 0 : 1;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) { return shoal::run(argc, argv); }
