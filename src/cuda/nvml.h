// NVIDIA's management library (libnvidia-ml.so.1), for what CUDA cannot say
// in this process: whether two GPUs reach each other's memory when one of
// them is hidden from it (CUDA_VISIBLE_DEVICES giving each process one GPU).
// NVML sees the GPUs CUDA_VISIBLE_DEVICES hides (not those a container or
// cgroup withholds), and names them by the UUID CUDA gives them.
//
// Loaded at the first question (dlopen of SHOAL_NVML_LIBRARY, initialized
// once for the process and never shut down: one library, no growth), with
// no NEEDED entry on it; without it the questions have an error as answer.
// Thread-safety: any thread.
#pragma once

#include <string>

#include "core/status.h"

namespace shoal::cuda::nvml {

// Whether GPUs `a` and `b` ("GPU-<uuid>", two distinct ones) read and write
// each other's memory both ways (NVML's peer-to-peer status OK for reads
// and writes, from each side). An error names why NVML could not tell (no
// library, an unknown GPU).
Result<bool> peerAccess(const std::string& a, const std::string& b);

}  // namespace shoal::cuda::nvml
