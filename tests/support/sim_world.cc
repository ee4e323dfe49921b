#include "support/sim_world.h"

#include <atomic>
#include <stdexcept>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "engine/engine.h"

namespace shoal::testing {

SimWorld::SimWorld(int nranks, CommOptions options) {
  static std::atomic<int> worldCounter{0};
  auto store = makeMemoryStore();
  std::string scope = str("sim", worldCounter.fetch_add(1));
  comms_.resize(nranks);
  std::vector<Status> results(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    InitRequest req;
    req.store = store;
    req.scope = scope;
    req.secret = scope;
    req.rank = r;
    req.nranks = nranks;
    req.options = options;
    comms_[r] = std::make_shared<Communicator>(std::move(req));
  }
  // Init waits for every rank to check in: one thread per rank, for set-up only.
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] { results[r] = comms_[r]->initialize(); });
  for (auto& t : threads) t.join();
  for (auto& s : results)
    if (!s.isOk()) throw std::runtime_error("SimWorld init failed: " + s.toString());
}

SimWorld::~SimWorld() = default;

std::vector<Status> SimWorld::run(std::vector<std::vector<OpRequest>> opsByRank) {
  std::vector<Status> results(comms_.size());
  std::vector<JobPtr> jobs(comms_.size());
  for (size_t r = 0; r < comms_.size(); ++r) {
    auto job = comms_[r]->enqueue(std::move(opsByRank[r]), /*detached=*/false);
    if (!job.isOk()) results[r] = job.takeStatus();
    else jobs[r] = job.value();
  }
  for (size_t r = 0; r < comms_.size(); ++r)
    if (jobs[r]) results[r] = comms_[r]->waitFor(*jobs[r]);
  return results;
}

std::vector<Status> SimWorld::runOne(std::vector<OpRequest> opByRank) {
  std::vector<std::vector<OpRequest>> groups(opByRank.size());
  for (size_t r = 0; r < opByRank.size(); ++r) groups[r].push_back(std::move(opByRank[r]));
  return run(std::move(groups));
}

}  // namespace shoal::testing
