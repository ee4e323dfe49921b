#include "core/turns.h"

#include <chrono>

namespace shoal {

std::shared_ptr<Turns::Turn> Turns::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::shared_ptr<Turn>(new Turn(shared_from_this(), next_++));
}

void Turns::finish(uint64_t ticket) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finishedEarly_.insert(ticket);
    while (!finishedEarly_.empty() && *finishedEarly_.begin() == serving_) {
      finishedEarly_.erase(finishedEarly_.begin());
      ++serving_;
    }
  }
  changed_.notify_all();
}

Status Turns::Turn::wait(Deadline deadline, const char* what) {
  Turns& t = *turns_;
  std::unique_lock<std::mutex> lock(t.mutex_);
  while (t.serving_ != ticket_) {
    if (deadline.expired()) {
      const uint64_t ahead = ticket_ - t.serving_;
      if (deadline.cancelled()) return error(Code::kAborted, what, ": cancelled while waiting for ", ahead,
                                             " earlier set-up call(s) of the communicator");
      return error(Code::kTimeout, what, ": timed out waiting for ", ahead,
                   " earlier set-up call(s) of the communicator (SHOAL_INIT_TIMEOUT_MS)");
    }
    t.changed_.wait_until(lock, Clock::time_point(std::chrono::nanoseconds(deadline.wakeAtNs())));
  }
  if (!t.broken_.empty()) return invalidUsage(what, ": ", t.broken_);
  return Status::ok();
}

void Turns::Turn::breakLater(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(turns_->mutex_);
    if (turns_->broken_.empty()) turns_->broken_ = why;
  }
  done();
}

void Turns::Turn::done() {
  if (done_) return;
  done_ = true;
  turns_->finish(ticket_);
}

}  // namespace shoal
