// MemoryStore: the in-process Store (tests; ncclCommInitAll).
//
// Owner: shared_ptr from makeMemoryStore(). Thread: any; one mutex guards the
// map, and one condition variable wakes waiting gets on every set.
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "bootstrap/bootstrap.h"

namespace shoal {
namespace {

class MemoryStore final : public Store {
 public:
  Status set(const std::string& key, std::string_view value, Deadline) override {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = std::string(value);
    changed_.notify_all();
    return Status::ok();
  }

  Result<std::vector<std::string>> get(const std::vector<std::string>& keys, Deadline deadline) override {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      std::vector<std::string> values;
      values.reserve(keys.size());
      std::string missing;
      for (const auto& key : keys) {
        auto it = values_.find(key);
        if (it == values_.end()) missing += (missing.empty() ? "" : ", ") + key;
        else values.push_back(it->second);
      }
      if (missing.empty()) return values;
      if (deadline.cancelled())
        return error(Code::kAborted, "memory store get: cancelled; missing: ", missing);
      if (deadline.expired())
        return error(Code::kTimeout, "memory store get: timed out; missing: ", missing);
      int64_t wakeNs = deadline.wakeAtNs();  // sooner than atNs() when cancellable
      if (wakeNs == Deadline::never().atNs()) changed_.wait(lock);
      else changed_.wait_until(lock, Clock::time_point(std::chrono::nanoseconds(wakeNs)));
    }
  }

  Status erase(const std::vector<std::string>& keys, Deadline) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& key : keys) values_.erase(key);
    return Status::ok();
  }

  Result<std::vector<bool>> check(const std::vector<std::string>& keys, Deadline) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<bool> exists;
    exists.reserve(keys.size());
    for (const auto& key : keys) exists.push_back(values_.count(key) != 0);
    return exists;
  }

  std::string describe() const override { return "memory"; }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::unordered_map<std::string, std::string> values_;
};

}  // namespace

std::shared_ptr<Store> makeMemoryStore() { return std::make_shared<MemoryStore>(); }

}  // namespace shoal
