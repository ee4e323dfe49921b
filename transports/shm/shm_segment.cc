#include "transports/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>

#include "core/log.h"
#include "core/process.h"
#include "memory/shared_memory.h"
#include "net/crypto.h"
#include "net/fd.h"

namespace shoal::shm {
namespace {

static_assert(sizeof(Header) <= kHeaderBytes);

size_t totalBytes(uint32_t ringBytes) { return kHeaderBytes + 2 * kControlBytes + 2 * size_t{ringBytes}; }

// Side `side` writes the ring it sends on and reads the other: the first
// pass through a ring would otherwise pay every page's first access
// (memory::prefaultPages), making a benchmark's first ~100 calls of a size up
// to 10x slower than later ones on the development VM.
void prefaultRings(const Segment& s, int side) {
  memory::prefaultPages(s.ring(side), s.ringBytes(), memory::PageAccess::kWrite);
  memory::prefaultPages(s.ring(1 - side), s.ringBytes(), memory::PageAccess::kRead);
}

net::Digest proofOf(std::string_view secret, const std::string& name) {
  return net::hmacSha256(secret, "shoal shm segment v1 " + name);
}

}  // namespace

Segment::Segment(Segment&& other) noexcept { *this = std::move(other); }

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    ringBytes_ = std::exchange(other.ringBytes_, 0);
    name_ = std::exchange(other.name_, {});
  }
  return *this;
}

Segment::~Segment() { release(); }

void Segment::release() {
  unlinkName();
  if (base_) munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

void Segment::unlinkName() {
  if (!name_.empty()) shm_unlink(name_.c_str());
  name_.clear();
}

Control& Segment::control(int senderSide) const {
  return *reinterpret_cast<Control*>(base_ + kHeaderBytes + static_cast<size_t>(senderSide) * kControlBytes);
}

uint8_t* Segment::ring(int senderSide) const {
  return base_ + kHeaderBytes + 2 * kControlBytes + static_cast<size_t>(senderSide) * ringBytes_;
}

Result<Segment> Segment::create(const std::string& name, uint32_t ringBytes, std::string_view secret,
                                CmaAbility creatorCanRead) {
  int raw = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (raw < 0 && errno == EEXIST) {
    // The name carries this process's pid: it can only be left by an earlier
    // communicator of this process with the same id whose peer never came.
    shm_unlink(name.c_str());
    raw = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  }
  if (raw < 0) return errnoStatus(errno, "shm_open(" + name + ", O_CREAT|O_EXCL)");
  net::Fd fd(raw);
  Segment s;
  s.name_ = name;  // unlinked by the destructor unless the opener takes it over
  s.ringBytes_ = ringBytes;
  s.bytes_ = totalBytes(ringBytes);
  if (ftruncate(fd.get(), static_cast<off_t>(s.bytes_)) != 0)
    return errnoStatus(errno, "ftruncate of shared-memory segment " + name + " (is /dev/shm full?)");
  void* base = mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (base == MAP_FAILED) return errnoStatus(errno, "mmap of shared-memory segment " + name);
  s.base_ = static_cast<uint8_t*>(base);
  // The object is zero-filled by ftruncate: atomics start at 0.
  Header& h = *new (s.base_) Header();
  h.version = kLayoutVersion;
  h.ringBytes = ringBytes;
  h.creatorPid = currentPid();
  net::Digest proof = proofOf(secret, name);
  std::memcpy(h.proof, proof.data(), sizeof(h.proof));
  for (int side = 0; side < 2; ++side) new (&s.control(side)) Control();
  h.canRead[0].store(static_cast<int32_t>(creatorCanRead), std::memory_order_relaxed);
  prefaultRings(s, 0);
  h.magic.store(kMagic, std::memory_order_release);
  return s;
}

Result<Segment> Segment::tryOpen(const std::string& name, std::string_view secret) {
  int raw = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (raw < 0) {
    if (errno == ENOENT) return Segment();
    return errnoStatus(errno, "shm_open(" + name + ")");
  }
  net::Fd fd(raw);
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return errnoStatus(errno, "fstat of shared-memory segment " + name);
  if (static_cast<size_t>(st.st_size) < kHeaderBytes) return Segment();  // creator still sizing it
  Segment s;
  s.bytes_ = static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (base == MAP_FAILED) return errnoStatus(errno, "mmap of shared-memory segment " + name);
  s.base_ = static_cast<uint8_t*>(base);
  Header& h = s.header();
  if (h.magic.load(std::memory_order_acquire) != kMagic) return Segment();  // not initialised yet
  // The ring size sizes every ring access (slot mask, frame limit): only the
  // sizes ringBytesFor() makes (a power of two, 64 KiB..256 MiB) are safe.
  if (h.version != kLayoutVersion || s.bytes_ != totalBytes(h.ringBytes) || h.ringBytes != ringBytesFor(h.ringBytes))
    return systemError("shared-memory segment ", name, " has layout version ", h.version, " and ", s.bytes_,
                       " bytes; this library expects version ", kLayoutVersion,
                       " (both ranks must load the same Shoal build)");
  net::Digest expected = proofOf(secret, name);
  if (!net::constantTimeEqual(expected.data(), h.proof, sizeof(h.proof)))
    return systemError("shared-memory segment ", name,
                       " was not created by a member of this communicator (wrong secret)");
  s.ringBytes_ = h.ringBytes;
  prefaultRings(s, 1);
  shm_unlink(name.c_str());  // both sides have it mapped: nothing to leak from now on
  return s;
}

std::string segmentName(int creatorPid, uint64_t commId, int lowRank, int highRank, int channel) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "/shoal-%d-%016" PRIx64 "-%d-%d-%d", creatorPid, commId, lowRank, highRank,
                channel);
  return buf;
}

void removeStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  int removed = 0;
  while (dirent* entry = readdir(dir)) {
    int pid = 0;
    if (std::sscanf(entry->d_name, "shoal-%d-", &pid) != 1 || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // creator alive (or not ours to judge)
    std::string name = std::string("/") + entry->d_name;
    if (shm_unlink(name.c_str()) == 0) ++removed;
  }
  closedir(dir);
  if (removed > 0)
    SHOAL_INFO(subsys::kShm | subsys::kInit, "removed ", removed,
               " shared-memory segments left by processes that no longer exist");
}

uint32_t ringBytesFor(int64_t requested) {
  uint64_t clamped = std::clamp<int64_t>(requested, 64 << 10, 256 << 20);
  return static_cast<uint32_t>(std::bit_ceil(clamped));
}

}  // namespace shoal::shm
