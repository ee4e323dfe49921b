#include "comm/deferred_release.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/log.h"

namespace shoal::deferred {
namespace {

struct Item {
  std::string what;
  std::function<bool()> passed;
  std::function<void()> free;
  Deadline deadline;
};

struct State {
  std::mutex mutex;
  std::vector<Item> items;
  size_t freeing = 0;    // taken out of items, not yet freed
  bool running = false;  // the thread is there (it clears this as it ends)
};

// Never destroyed: the thread may outlive static destruction at exit.
State& state() {
  static auto* s = new State();
  return *s;
}

void run() {
  State& s = state();
  for (;;) {
    std::vector<Item> ready;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      for (size_t i = 0; i < s.items.size();) {
        Item& item = s.items[i];
        const bool passed = item.passed();
        if (passed || item.deadline.expired()) {
          if (!passed)
            SHOAL_WARN(item.what, ": a CUDA stream has not passed it since the communicator's end; its memory "
                       "is left allocated");
          else
            ready.push_back(std::move(item));
          s.items.erase(s.items.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
        ++i;
      }
      if (s.items.empty() && ready.empty()) {
        s.running = false;
        return;
      }
      s.freeing += ready.size();
    }
    for (Item& item : ready) item.free();  // outside the lock: it may take the driver's
    if (!ready.empty()) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.freeing -= ready.size();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

}  // namespace

void release(std::string what, std::function<bool()> passed, std::function<void()> free, int64_t deadlineMs) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.items.push_back({std::move(what), std::move(passed), std::move(free), Deadline::afterMs(deadlineMs)});
  if (!s.running) {
    s.running = true;
    std::thread(run).detach();
  }
}

size_t waiting() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.items.size() + s.freeing;
}

}  // namespace shoal::deferred
