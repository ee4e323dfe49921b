#include "comm/deferred_release.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/log.h"
#include "core/process.h"

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
  std::condition_variable idle;  // freeing reached 0 or the thread ended
  std::vector<Item> items;
  size_t freeing = 0;     // taken out of items, not yet freed
  bool running = false;   // the thread is there (it clears this as it ends)
  bool stopping = false;  // the process exits: touch nothing more
  std::vector<Item> abandoned;  // what still waited then, never freed
};

// Never destroyed: the thread may outlive static destruction at exit. A
// forked child starts afresh (the parent's thread is not there, and its
// lock may have been held).
State* gState = nullptr;
std::once_flag gHooks;

State& state() {
  std::call_once(gHooks, [] {
    gState = new State();
    ::pthread_atfork(nullptr, nullptr, [] { gState = new State(); });
    // At exit the CUDA driver may tear its contexts down, and with them the
    // pinned words the thread reads: it stops first, leaving what still
    // waits allocated (the process is going).
    std::atexit([] {
      State& s = *gState;
      std::unique_lock<std::mutex> lock(s.mutex);
      s.stopping = true;
      for (Item& item : s.items) s.abandoned.push_back(std::move(item));
      s.items.clear();
      s.idle.wait_for(lock, std::chrono::seconds(1), [&] { return s.freeing == 0 && !s.running; });
    });
  });
  return *gState;
}

void run(State& s) {
  markLibraryThread();
  for (;;) {
    std::vector<Item> ready;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      if (s.stopping) {
        s.running = false;
        s.idle.notify_all();
        return;
      }
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
        s.idle.notify_all();
        return;
      }
      s.freeing += ready.size();
    }
    for (Item& item : ready) item.free();  // outside the lock: it may take the driver's
    if (!ready.empty()) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.freeing -= ready.size();
      s.idle.notify_all();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

}  // namespace

void release(std::string what, std::function<bool()> passed, std::function<void()> free, int64_t deadlineMs) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.stopping) {  // exiting: nothing is freed any more
    s.abandoned.push_back({std::move(what), std::move(passed), std::move(free), Deadline::never()});
    return;
  }
  s.items.push_back({std::move(what), std::move(passed), std::move(free), Deadline::afterMs(deadlineMs)});
  if (!s.running) {
    s.running = true;
    std::thread(run, std::ref(s)).detach();
  }
}

size_t waiting() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.items.size() + s.freeing;
}

}  // namespace shoal::deferred
