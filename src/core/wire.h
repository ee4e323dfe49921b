// The byte codec of every message Shoal builds itself (store frames, peer
// records, the init agreement, split records): little-endian integers and
// length-prefixed strings, written into a growing buffer and read back from a
// bounded span with every read checked. Thread: none (values).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "core/byte_order.h"

namespace shoal::wire {

// The longest string a Reader accepts unless told otherwise.
inline constexpr uint32_t kMaxStringBytes = 64u << 20;

// Appends little-endian values and length-prefixed strings.
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  // Bytes written so far, and a u32 written earlier at `at` overwritten
  // (length fields known only once their body is written).
  size_t size() const { return out_.size(); }
  void patchU32(size_t at, uint32_t v) { putLe(out_.data() + at, v, 4); }

 private:
  void le(uint64_t v, int n) {
    uint8_t bytes[8];
    putLe(bytes, v, n);
    out_.insert(out_.end(), bytes, bytes + n);
  }
  std::vector<uint8_t>& out_;
};

// Reads from a bounded span; every read is checked, and a failed read makes
// ok() false for good (callers check once at the end).
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), left_(size) {}
  bool ok() const { return ok_; }
  bool atEnd() const { return left_ == 0; }
  uint8_t u8() { return static_cast<uint8_t>(le(1)); }
  uint16_t u16() { return static_cast<uint16_t>(le(2)); }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  void bytes(void* out, size_t n) {
    if (!take(n)) {
      std::memset(out, 0, n);
      return;
    }
    std::memcpy(out, p_ - n, n);
  }
  // A length-prefixed string no longer than maxBytes (and than what is left).
  std::string str(uint32_t maxBytes = kMaxStringBytes) {
    uint32_t n = u32();
    if (!ok_ || n > maxBytes || n > left_) {
      ok_ = false;
      return {};
    }
    take(n);
    return std::string(reinterpret_cast<const char*>(p_ - n), n);
  }
  // A count of items each at least minItemBytes long: refuses counts the
  // remaining bytes cannot hold, so a count never sizes an allocation alone.
  uint32_t count(size_t minItemBytes) {
    uint32_t n = u32();
    if (!ok_ || (minItemBytes > 0 && n > left_ / minItemBytes)) {
      ok_ = false;
      return 0;
    }
    return n;
  }

 private:
  bool take(size_t n) {
    if (!ok_ || n > left_) {
      ok_ = false;
      return false;
    }
    p_ += n;
    left_ -= n;
    return true;
  }
  uint64_t le(int n) {
    if (!take(static_cast<size_t>(n))) return 0;
    return getLe(p_ - n, n);
  }
  const uint8_t* p_;
  size_t left_;
  bool ok_ = true;
};

}  // namespace shoal::wire
