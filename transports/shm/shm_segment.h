// ShmSegment: the shared-memory file one shm connection lives in, and its layout.
//
// Role: owns the mapping of one POSIX shared-memory object (/dev/shm/shoal-*)
// shared by exactly two processes of one host: the lower rank of the pair
// creates it ("side 0"), the higher rank opens it ("side 1") and unlinks the
// name as soon as it has mapped it, so a finished or killed run leaves nothing
// behind once both sides attached. Names carry the creator's pid, so objects
// left by runs killed before the peer attached are found and removed by
// removeStaleSegments() (called once per process).
//
// Layout (every field that one side writes and the other polls sits on its own
// 128-byte line, so polling never shares a line with the writer's other data):
//   [Header][Control side 0][Control side 1][ring sent by side 0][ring sent by side 1]
// A ring is an array of 64-byte slots carrying frames (shm_connection.h).
//
// Thread: a segment is used by one Connection; no locks.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace shoal::shm {

inline constexpr uint64_t kMagic = 0x53484f414c53484dull;  // "SHOALSHM"
inline constexpr uint32_t kLayoutVersion = 4;
// A failure report: a chain of reports grows by a few hundred bytes per rank
// it passes through, and keeps its first cause at its end.
inline constexpr size_t kReasonBytes = 8192;
inline constexpr size_t kSlotBytes = 64;
inline constexpr size_t kLineBytes = 128;

// Whether a side can read the other's memory with process_vm_readv.
enum class CmaAbility : int32_t { kUnknown = 0, kYes = 1, kNo = 2 };

struct alignas(kLineBytes) Header {
  std::atomic<uint64_t> magic;  // stored last by the creator (release)
  uint32_t version;
  uint32_t ringBytes;           // bytes of each direction's ring
  int32_t creatorPid;
  uint32_t reserved;
  uint8_t proof[32];            // HMAC(secret, name): the creator knew the communicator's secret
  alignas(kLineBytes) std::atomic<int32_t> openerPid;  // 0 until side 1 attached
  alignas(kLineBytes) std::atomic<int32_t> canRead[2];  // CmaAbility of side s reading the other side
  alignas(kLineBytes) std::atomic<int32_t> closed[2];   // side s has gone (destroyed or failed)
  // Why side s failed (written before or after closed[s]: a failed job
  // closes its connections first); length stored last, then reasonFinal[s]
  // once side s will add nothing (Connection::publishFailure).
  alignas(kLineBytes) std::atomic<uint32_t> reasonLength[2];
  std::atomic<uint32_t> reasonFinal[2];
  char reason[2][kReasonBytes];
};

// What a receiver publishes to the sender of one direction.
struct alignas(kLineBytes) Control {
  std::atomic<uint64_t> consumedSlots;  // slots the receiver has finished with
  alignas(kLineBytes) std::atomic<uint64_t> cmaReads;  // single-copy messages read out of the sender
};

// The segment's layout: the Header in whole pages, each direction's Control,
// then the two rings (side 0 sends on the first).
inline constexpr size_t kPageBytes = 4096;
inline constexpr size_t kHeaderBytes = (sizeof(Header) + kPageBytes - 1) / kPageBytes * kPageBytes;
inline constexpr size_t kControlBytes = 2 * kLineBytes;
static_assert(sizeof(Control) <= kControlBytes);

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);

class Segment {
 public:
  Segment() = default;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  ~Segment();

  // Side 0: creates and initialises the object `name` (O_EXCL, mode 0600).
  static Result<Segment> create(const std::string& name, uint32_t ringBytes, std::string_view secret,
                                CmaAbility creatorCanRead);
  // Side 1: maps `name` if the creator has finished initialising it; returns
  // an empty Segment (mapped() false) when it does not exist yet. Checks the
  // layout and the creator's proof of the secret, then unlinks the name.
  static Result<Segment> tryOpen(const std::string& name, std::string_view secret);

  bool mapped() const { return base_ != nullptr; }
  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  // Control written by the receiver of the ring that `senderSide` fills.
  Control& control(int senderSide) const;
  uint8_t* ring(int senderSide) const;
  uint32_t ringBytes() const { return ringBytes_; }
  // Removes the name if this side still owns it (creator whose peer never came).
  void unlinkName();

 private:
  void release();

  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  uint32_t ringBytes_ = 0;
  std::string name_;  // non-empty while this process may still have to unlink it
};

// "/shoal-<creator pid>-<commId>-<rank lo>-<rank hi>-<channel>".
std::string segmentName(int creatorPid, uint64_t commId, int lowRank, int highRank, int channel);

// Removes /dev/shm/shoal-<pid>-* objects whose creator process no longer exists.
void removeStaleSegments();

// Bytes per ring for a requested size: a power of two in [64 KiB, 256 MiB].
uint32_t ringBytesFor(int64_t requested);

}  // namespace shoal::shm
