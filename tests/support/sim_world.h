// SimWorld: N ranks of one communicator in one process, one thread.
//
// Role: the harness of sim tests (docs/design.md, Principles: "Everything has
// a fake"). Ranks
// share an in-memory store and talk over the loopback transport; an operation
// round enqueues every rank's job and then pumps the engine from this thread
// until all are done, so a test is deterministic apart from the loopback
// transport's seeded fault plan.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace shoal::testing {

class SimWorld {
 public:
  explicit SimWorld(int nranks, CommOptions options = {});
  ~SimWorld();

  int size() const { return static_cast<int>(comms_.size()); }
  Communicator& comm(int rank) { return *comms_[rank]; }
  std::shared_ptr<Communicator> shared(int rank) { return comms_[rank]; }

  // Runs one group of operations per rank (opsByRank[r] on rank r) and returns
  // each rank's status.
  std::vector<Status> run(std::vector<std::vector<OpRequest>> opsByRank);
  // One operation per rank.
  std::vector<Status> runOne(std::vector<OpRequest> opByRank);

 private:
  std::vector<std::shared_ptr<Communicator>> comms_;
};

}  // namespace shoal::testing
