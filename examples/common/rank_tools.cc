// Job-wide numbers and checks over NCCL; see rank_tools.h.
#include "rank_tools.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "check.h"

namespace shoal::examples {

double sumOverRanks(ncclComm_t comm, double value) {
  CHECK_NCCL(ncclAllReduce(&value, &value, 1, ncclDouble, ncclSum, comm, nullptr));
  return value;
}

double maxOverRanks(ncclComm_t comm, double value) {
  CHECK_NCCL(ncclAllReduce(&value, &value, 1, ncclDouble, ncclMax, comm, nullptr));
  return value;
}

bool identicalOnAllRanks(ncclComm_t comm, const float* data, size_t count) {
  std::vector<uint32_t> smallest(count), largest(count);
  std::memcpy(smallest.data(), data, count * sizeof(float));
  std::memcpy(largest.data(), data, count * sizeof(float));
  CHECK_NCCL(ncclGroupStart());
  CHECK_NCCL(ncclAllReduce(smallest.data(), smallest.data(), count, ncclUint32, ncclMin, comm, nullptr));
  CHECK_NCCL(ncclAllReduce(largest.data(), largest.data(), count, ncclUint32, ncclMax, comm, nullptr));
  CHECK_NCCL(ncclGroupEnd());
  return smallest == largest;
}

}  // namespace shoal::examples
