#include "topology/machine.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#ifdef SHOAL_HAVE_HWLOC
#include <hwloc.h>
#endif

#include "core/log.h"

namespace shoal {
namespace {

constexpr unsigned kNvidiaVendor = 0x10de;
constexpr unsigned kDisplayClass = 0x03;  // PCI base class: VGA, 3D controller, ...

std::vector<std::string> listDirectory(const std::string& path) {
  std::vector<std::string> names;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir(path.c_str()), closedir);
  if (!dir) return names;
  while (dirent* e = readdir(dir.get())) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string readLine(const std::string& path) {
  std::string line;
  std::ifstream in(path);
  std::getline(in, line);
  return line;
}

// Interfaces from sysfs: hwloc knows only PCI-backed ones, and the tcp
// transport may use any (lo included).
std::vector<std::string> networkInterfaces() { return listDirectory("/sys/class/net"); }

// NVIDIA display or 3D controllers: the GPUs CUDA can use.
int gpusOnPci() {
  int gpus = 0;
  for (const std::string& dev : listDirectory("/sys/bus/pci/devices")) {
    std::string base = "/sys/bus/pci/devices/" + dev + "/";
    unsigned long vendor = std::strtoul(readLine(base + "vendor").c_str(), nullptr, 16);
    unsigned long pciClass = std::strtoul(readLine(base + "class").c_str(), nullptr, 16);
    if (vendor == kNvidiaVendor && (pciClass >> 16) == kDisplayClass) ++gpus;  // class: base, sub, prog-if
  }
  return gpus;
}

// "cpu12" is numbered with prefix "cpu"; "cpufreq" is not.
bool isNumbered(std::string_view name, std::string_view prefix) {
  return name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix &&
         std::all_of(name.begin() + static_cast<long>(prefix.size()), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

std::string formatBytes(uint64_t bytes) {
  if (bytes == 0) return "unknown";
  if (bytes % (1u << 20) == 0) return str(bytes >> 20, " MiB");
  if (bytes % (1u << 10) == 0) return str(bytes >> 10, " KiB");
  return str(bytes, " B");
}

std::string plural(int n, const char* noun) { return str(n, " ", noun, n == 1 ? "" : "s"); }

}  // namespace

#ifdef SHOAL_HAVE_HWLOC
Result<MachineTopology> discoverMachineWithHwloc() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return systemError("hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, void (*)(hwloc_topology_t)> topo(raw, hwloc_topology_destroy);
  // The whole machine, not this process's cpuset: every process of a host
  // must see the same facts (they feed the tuner, which must agree).
  hwloc_topology_set_flags(topo.get(), HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED);
  // No I/O objects: hwloc's PCI discovery triples the time (about 75 ms here)
  // to read the same sysfs files gpusOnPci() reads directly.
  if (hwloc_topology_load(topo.get()) != 0) return systemError("hwloc_topology_load failed");

  auto count = [&](hwloc_obj_type_t type) { return hwloc_get_nbobjs_by_type(topo.get(), type); };
  auto cacheBytes = [&](hwloc_obj_type_t type) -> uint64_t {
    hwloc_obj_t cache = hwloc_get_obj_by_type(topo.get(), type, 0);
    return cache ? cache->attr->cache.size : 0;
  };
  MachineTopology m;
  m.source = "hwloc";
  m.packages = std::max(1, count(HWLOC_OBJ_PACKAGE));
  m.cores = std::max(1, count(HWLOC_OBJ_CORE) > 0 ? count(HWLOC_OBJ_CORE) : count(HWLOC_OBJ_PU));
  m.numaNodes = std::max(1, count(HWLOC_OBJ_NUMANODE));
  m.l2Bytes = cacheBytes(HWLOC_OBJ_L2CACHE);
  m.l3Bytes = cacheBytes(HWLOC_OBJ_L3CACHE);
  m.l3Count = std::max(0, count(HWLOC_OBJ_L3CACHE));
  m.gpus = gpusOnPci();
  m.nics = networkInterfaces();
  return m;
}
#else
Result<MachineTopology> discoverMachineWithHwloc() {
  return error(Code::kUnsupported, "built without hwloc");
}
#endif

MachineTopology discoverMachineFromSystem() {
  MachineTopology m;
  m.source = "sysfs";
  // Distinct (package, core) pairs are the physical cores.
  std::set<std::pair<std::string, std::string>> cores;
  std::set<std::string> packages;
  for (const std::string& cpu : listDirectory("/sys/devices/system/cpu")) {
    if (!isNumbered(cpu, "cpu")) continue;
    std::string base = "/sys/devices/system/cpu/" + cpu + "/topology/";
    std::string package = readLine(base + "physical_package_id");
    std::string core = readLine(base + "core_id");
    if (package.empty() || core.empty()) continue;
    packages.insert(package);
    cores.emplace(package, core);
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  m.cores = !cores.empty() ? static_cast<int>(cores.size()) : static_cast<int>(std::max(1L, online));
  m.packages = std::max<int>(1, static_cast<int>(packages.size()));
  std::vector<std::string> nodes = listDirectory("/sys/devices/system/node");
  m.numaNodes = std::max<int>(1, static_cast<int>(std::count_if(
      nodes.begin(), nodes.end(), [](const std::string& n) { return isNumbered(n, "node"); })));
  // glibc answers these from CPUID where sysfs has no cache directory.
  m.l2Bytes = static_cast<uint64_t>(std::max(0L, sysconf(_SC_LEVEL2_CACHE_SIZE)));
  m.l3Bytes = static_cast<uint64_t>(std::max(0L, sysconf(_SC_LEVEL3_CACHE_SIZE)));
  m.l3Count = m.l3Bytes > 0 ? m.packages : 0;
  m.gpus = gpusOnPci();
  m.nics = networkInterfaces();
  return m;
}

const MachineTopology& localMachine() {
  static const MachineTopology machine = [] {
    Result<MachineTopology> discovered = discoverMachineWithHwloc();
    MachineTopology m;
    if (discovered.isOk()) {
      m = std::move(discovered).value();
    } else if (discovered.status().code() == Code::kUnsupported) {
      // Built without hwloc: the expected path, not a warning.
      SHOAL_INFO(subsys::kGraph | subsys::kInit, "topology: built without hwloc; using sysconf and sysfs");
      m = discoverMachineFromSystem();
    } else {
      SHOAL_WARN("topology: hwloc discovery failed (", discovered.status().toString(),
                 "); using sysconf and sysfs");
      m = discoverMachineFromSystem();
    }
    SHOAL_INFO(subsys::kGraph | subsys::kInit, "topology: ", describeMachine(m), " (", m.source, ")");
    return m;
  }();
  return machine;
}

void writeMachineFacts(wire::Writer& w, const MachineTopology& m) {
  w.u32(static_cast<uint32_t>(m.packages));
  w.u32(static_cast<uint32_t>(m.cores));
  w.u32(static_cast<uint32_t>(m.numaNodes));
  w.u64(m.l2Bytes);
  w.u64(m.l3Bytes);
  w.u32(static_cast<uint32_t>(m.l3Count));
  w.u32(static_cast<uint32_t>(m.gpus));
}

Result<MachineTopology> readMachineFacts(wire::Reader& r) {
  // Counts a machine could have; anything else is not a writer's.
  auto count = [&](uint32_t limit) {
    uint32_t v = r.u32();
    return v <= limit ? static_cast<int>(v) : -1;
  };
  MachineTopology m;
  m.packages = count(1u << 16);
  m.cores = count(1u << 24);
  m.numaNodes = count(1u << 16);
  m.l2Bytes = r.u64();
  m.l3Bytes = r.u64();
  m.l3Count = count(1u << 16);
  m.gpus = count(1u << 16);
  if (!r.ok() || m.packages < 0 || m.cores < 0 || m.numaNodes < 0 || m.l3Count < 0 || m.gpus < 0)
    return invalidArgument("malformed machine facts");
  return m;
}

MachineTopology agreedMachine(const std::vector<MachineTopology>& machines) {
  if (machines.empty()) return MachineTopology{};
  MachineTopology m = machines.front();
  for (const MachineTopology& other : machines) {
    m.packages = std::min(m.packages, other.packages);
    m.cores = std::min(m.cores, other.cores);
    m.numaNodes = std::min(m.numaNodes, other.numaNodes);
    m.l2Bytes = std::min(m.l2Bytes, other.l2Bytes);
    m.l3Bytes = std::min(m.l3Bytes, other.l3Bytes);
    m.l3Count = std::min(m.l3Count, other.l3Count);
    m.gpus = std::min(m.gpus, other.gpus);
  }
  return m;
}

std::string describeMachine(const MachineTopology& m) {
  std::string nics;
  for (const std::string& n : m.nics) nics += (nics.empty() ? "" : ", ") + n;
  return str(plural(m.packages, "package"), ", ", plural(m.cores, "core"), ", ",
             plural(m.numaNodes, "NUMA node"), ", L2 ", formatBytes(m.l2Bytes), ", L3 ",
             formatBytes(m.l3Bytes), ", NICs: ", nics.empty() ? "none" : nics, "; GPUs: ",
             m.gpus == 0 ? std::string("none") : std::to_string(m.gpus));
}

}  // namespace shoal
