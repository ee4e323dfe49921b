// MachineTopology: the facts about this host that the tuner uses.
//
// Role: discovered once per process (hwloc: packages, cores, NUMA nodes,
// caches; GPUs from the PCI devices in sysfs; network interfaces from
// /sys/class/net, since hwloc lists only PCI-backed ones and tcp may use any),
// logged once at INFO GRAPH|INIT.
// If hwloc fails, the same facts come from sysconf and sysfs with a WARN;
// discovery never fails. The whole machine is described, not this process's
// cpuset, so every process of a host sees the same value.
// Thread-safety: localMachine() is safe from any thread (computed once).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/wire.h"

namespace shoal {

struct MachineTopology {
  int packages = 1;
  int cores = 1;           // physical cores of the machine
  int numaNodes = 1;
  uint64_t l2Bytes = 0;    // one L2 cache (0: unknown)
  uint64_t l3Bytes = 0;    // one L3 cache (0: unknown)
  int l3Count = 0;         // L3 caches in the machine (0: unknown)
  std::vector<std::string> nics;  // network interface names, sorted
  int gpus = 0;            // NVIDIA display/3D controllers on PCI
  std::string source;      // "hwloc" or "sysfs"
};

// Discovered on first call, then cached; logs once.
const MachineTopology& localMachine();

// The two discovery paths, uncached and silent (tests, calibrate_links).
Result<MachineTopology> discoverMachineWithHwloc();
MachineTopology discoverMachineFromSystem();

// The facts every rank can agree on: the element-wise minimum (a tuner that
// assumes less cache or fewer cores than a host has is slower, never wrong).
MachineTopology agreedMachine(const std::vector<MachineTopology>& machines);

// "1 package, 2 cores, 1 NUMA node, L2 1 MiB, L3 32 MiB, NICs: lo, eth0; GPUs: none"
std::string describeMachine(const MachineTopology& m);

// The numeric facts agreedMachine() combines (packages, cores, NUMA nodes,
// L2 and L3 sizes, L3 count, GPUs), for pooling them over the bootstrap;
// NICs and source are not carried. readMachineFacts refuses what a writer
// could not have written (another process's bytes).
void writeMachineFacts(wire::Writer& w, const MachineTopology& m);
Result<MachineTopology> readMachineFacts(wire::Reader& r);

}  // namespace shoal
