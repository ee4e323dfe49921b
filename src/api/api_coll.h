// Shared pieces of the collective entry points and Shoal's host streams.
#pragma once

#include <nccl.h>

#include <memory>
#include <mutex>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"

namespace shoal::api {

// A Shoal host stream (include/shoal/shoal.h): operations queued on it run in
// the background (the engine's progress thread); synchronize waits for them.
// Thread-safety: a mutex guards the job list; one user thread at a time.
class HostStream {
 public:
  static constexpr uint64_t kMagic = 0x73686f616c737472ull;  // "shoalstr"
  uint64_t magic = kMagic;

  Status enqueue(const std::shared_ptr<Communicator>& comm, OpRequest req);
  Status synchronize();
  bool idle();

 private:
  struct Entry {
    std::shared_ptr<Communicator> comm;
    JobPtr job;
  };
  std::mutex mutex_;
  std::vector<Entry> jobs_;
};

// The host stream behind a cudaStream_t argument, or null for any other stream.
HostStream* findHostStream(cudaStream_t stream);
void registerHostStream(HostStream* stream);
void unregisterHostStream(HostStream* stream);

Status checkDataTypePublic(ncclDataType_t datatype);

// Runs (or records, in a group) a validated operation; see api_coll.cc.
Status dispatch(ncclComm_t handle, const std::shared_ptr<Communicator>& comm, OpRequest&& req,
                cudaStream_t stream);

}  // namespace shoal::api
