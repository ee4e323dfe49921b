// RingQueue<T>: a FIFO over a power-of-two array that grows by doubling and
// never shrinks, so a steady-state data path that queues and retires work
// allocates nothing. Not thread-safe; transports use it for their op queues.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace shoal {

template <typename T>
class RingQueue {
 public:
  bool empty() const { return head_ == tail_; }
  size_t size() const { return static_cast<size_t>(tail_ - head_); }
  T& front() { return items_[head_ & mask_]; }
  const T& front() const { return items_[head_ & mask_]; }
  T& operator[](size_t i) { return items_[(head_ + i) & mask_]; }
  void pop_front() { ++head_; }
  T& push_back() {
    if (size() == items_.size()) grow();
    return items_[tail_++ & mask_];
  }

 private:
  void grow() {
    size_t capacity = items_.empty() ? 16 : items_.size() * 2;
    std::vector<T> bigger(capacity);
    for (size_t i = 0; i < size(); ++i) bigger[i] = std::move((*this)[i]);
    tail_ = size();
    head_ = 0;
    items_.swap(bigger);
    mask_ = capacity - 1;
  }
  std::vector<T> items_;
  uint64_t mask_ = 0;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
};

}  // namespace shoal
