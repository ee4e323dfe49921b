// fuzz_shm_ring: what an shm connection reads from the shared-memory segment
// its peer process writes (transports/shm/): the segment header the creator
// lays out (Segment::tryOpen checks magic, version, size and proof; the
// ring size it accepts then sizes every ring access) and the frames in the
// ring: a 32-byte header {stamp, tag, message bytes, frame bytes, kind} in a
// 64-byte slot, then the payload, or for a single-copy frame the address of
// the message in the sender's memory.
//
// The harness plays the creator (side 0) of a segment named like the real
// ones; a real ShmConnection is the opener (side 1) and receives what the
// harness writes into side 0's ring. The frame decoder (pumpRecvs) is
// private, so it is reached through the public postRecv/postRecvReduce/poll.
// An honest header comes from Segment::create; a forged one is written field
// by field, at the layout shm_segment.h documents (header page, two control
// blocks of 256 bytes, ring of side 0, ring of side 1) with the proof
// computed as shm_segment.cc does, so that a peer that knows the
// communicator's secret but writes a bad layout is covered too.
//
// Input: u8 flags (bit0 forged header, bit1 single copy allowed to this
// side, bit2 at the end the peer marks itself closed, with a reason whose
// stored length overstates it), then
//   honest: u8 r (ring = 64 KiB << r % 2)
//   forged: u8 f (bit0 wrong magic, bit1 wrong proof), u32 version xor 2,
//           u32 ring bytes, u32 file size delta (file = 4608 + 2 x ring +
//           delta, at most 256 KiB; delta 0 is the size the ring implies)
// then u8 receives (1 + n % 8), each {u32 bytes % (128 KiB + 1), u64 tag,
// u8 reduce (bit0: reduce on receive with op (r >> 1) % 5), u8 dtype (% 12,
// bit7 received first)}, then frames until the input ends, each {u64 tag,
// u64 message bytes, u32 frame bytes, u32 kind, u16 n, n payload bytes}
// (a single-copy frame whose address is 0 points at a buffer of this
// process, so that its read succeeds).
//
// Properties: the opener attaches only to a segment whose header the real
// creator could have written (a power-of-two ring of 64 KiB..256 MiB);
// receives match frames in order, and one completes only if its frames
// name its tag and size (shm_connection.h); none completes twice or with
// another size than posted.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "core/types.h"
#include "fuzz_common.h"
#include "net/crypto.h"
#include "transports/shm/shm_connection.h"
#include "transports/shm/shm_segment.h"

namespace {

using namespace shoal;
using shoal_fuzz::Input;

constexpr size_t kHeaderPage = shm::kHeaderBytes;
constexpr size_t kControlBytes = shm::kControlBytes;
constexpr size_t kFrameHeader = 32;      // shm_connection.cc kFrameHeaderBytes
constexpr size_t kMaxFileBytes = 256 << 10;
constexpr uint64_t kMaxRecvBytes = 128 << 10;
constexpr char kSecret[] = "fuzz secret";

size_t totalBytes(uint64_t ring) { return kHeaderPage + 2 * kControlBytes + 2 * ring; }

// A buffer of this process that single-copy frames may point at.
uint8_t gSource[kMaxRecvBytes];

struct Recv {
  uint64_t bytes = 0;
  uint64_t tag = 0;
  bool reduce = false;
  ReduceOp op = ReduceOp::kSum;
  DataType dtype = DataType::kUint8;
  bool receivedFirst = false;
};

// The creator's side of one segment: its mapping and where its ring is.
struct Creator {
  shm::Segment honest;          // when made by Segment::create
  uint8_t* forgedBase = nullptr;  // when forged
  size_t forgedBytes = 0;
  std::string name;

  shm::Header* header = nullptr;
  shm::Control* control = nullptr;  // written by the receiver of ring 0
  uint8_t* ring = nullptr;          // ring 0: written by us, read by the connection
  uint64_t ringBytes = 0;           // what we may write there

  ~Creator() {
    if (forgedBase) {
      munmap(forgedBase, forgedBytes);
      shm_unlink(name.c_str());
    }
  }
};

bool makeHonest(Creator& c, uint64_t ringBytes) {
  Result<shm::Segment> s = shm::Segment::create(c.name, static_cast<uint32_t>(ringBytes), kSecret,
                                                shm::CmaAbility::kYes);
  if (!s.isOk()) return false;
  c.honest = std::move(s.value());
  c.header = &c.honest.header();
  c.control = &c.honest.control(0);
  c.ring = c.honest.ring(0);
  c.ringBytes = c.honest.ringBytes();
  return true;
}

bool makeForged(Creator& c, Input& in) {
  uint8_t f = in.u8();
  uint32_t version = in.u32() ^ shm::kLayoutVersion;
  uint32_t ringBytes = in.u32();
  uint32_t delta = in.u32();
  uint64_t size = totalBytes(ringBytes) + delta;
  if (size > kMaxFileBytes) size = kMaxFileBytes;
  int fd = shm_open(c.name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    shm_unlink(c.name.c_str());
    return false;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(c.name.c_str());
    return false;
  }
  c.forgedBase = static_cast<uint8_t*>(base);
  c.forgedBytes = size;
  if (size < kHeaderPage + 2 * kControlBytes) return true;  // the opener will wait for the creator
  auto* h = new (base) shm::Header();
  h->version = version;
  h->ringBytes = ringBytes;
  h->creatorPid = getpid();
  net::Digest proof = net::hmacSha256(kSecret, "shoal shm segment v1 " + c.name);
  std::memcpy(h->proof, proof.data(), sizeof(h->proof));
  if (f & 2) h->proof[0] ^= 1;
  h->canRead[0].store(static_cast<int32_t>(shm::CmaAbility::kYes));
  for (int side = 0; side < 2; ++side)
    new (c.forgedBase + kHeaderPage + side * kControlBytes) shm::Control();
  c.header = h;
  c.control = reinterpret_cast<shm::Control*>(c.forgedBase + kHeaderPage);
  // Ring 0 as the layout puts it, if the file holds it: we write only there.
  uint64_t ringStart = kHeaderPage + 2 * kControlBytes;
  if (ringBytes >= 64 && size >= ringStart + ringBytes) {
    c.ring = c.forgedBase + ringStart;
    c.ringBytes = ringBytes;
  }
  h->magic.store((f & 1) ? shm::kMagic ^ 1 : shm::kMagic, std::memory_order_release);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint64_t counter = 0;
  Input in(data, size);
  uint8_t flags = in.u8();

  Creator creator;
  creator.name = shm::segmentName(getpid(), 0xf0220000ull + counter++, 0, 1, 0);
  bool made = (flags & 1) ? makeForged(creator, in) : makeHonest(creator, uint64_t{64 << 10} << (in.u8() % 2));
  if (!made) return 0;

  shm::ConnectionSetup setup;
  setup.side = 1;
  setup.segmentName = creator.name;
  setup.secret = kSecret;
  setup.peerPid = getpid();
  setup.selfCanRead = (flags & 2) ? shm::CmaAbility::kYes : shm::CmaAbility::kNo;
  setup.cmaMinBytes = 64 << 10;
  setup.attachDeadline = Deadline::afterMs(60'000);
  setup.peerDescription = "fuzz peer";
  shm::ShmConnection conn(std::move(setup));

  std::vector<Completion> done;
  bool failed = false;
  auto pollOnce = [&]() -> bool {
    // Cleared first: completions a failing poll returned were collected once.
    done.clear();
    if (failed) return false;
    bool progressed = false;
    Status s = conn.poll(done, progressed);
    (void)conn.mightProgress();
    if (!s.isOk()) failed = true;
    return progressed && !failed;
  };
  pollOnce();  // attaches, as the first poll of a real connection does
  // reducesOnReceive(1) is whether the connection attached (1 byte is below
  // the single-copy threshold).
  if (creator.forgedBase != nullptr && conn.reducesOnReceive(1)) {
    uint32_t ring = creator.header->ringBytes;
    FUZZ_CHECK(ring >= (64u << 10) && ring <= (256u << 20) && (ring & (ring - 1)) == 0,
               "attached to a forged segment whose rings are %u bytes", ring);
    FUZZ_CHECK(creator.header->magic.load() == shm::kMagic && creator.header->version == shm::kLayoutVersion,
               "attached to a segment of another layout");
  }

  std::vector<Recv> recvs(1 + in.u8() % 8);
  std::vector<std::vector<uint8_t>> dst(recvs.size()), other(recvs.size());
  std::vector<bool> completed(recvs.size(), false);
  const uint64_t scalar[2] = {0x3ff0000000000000ull, 0x3ff0000000000000ull};
  for (size_t i = 0; i < recvs.size() && !failed; ++i) {
    Recv& r = recvs[i];
    r.bytes = in.u32() % (kMaxRecvBytes + 1);
    r.tag = in.u64();
    uint8_t red = in.u8();
    uint8_t d = in.u8();
    r.reduce = red & 1;
    r.op = static_cast<ReduceOp>((red >> 1) % 5);
    r.dtype = static_cast<DataType>((d & 0x7f) % kNumDataTypes);
    r.receivedFirst = d & 0x80;
    dst[i].assign(r.bytes, 0);
    // The engine reduces on receive only where the transport says it can,
    // and always whole elements.
    if (r.reduce && conn.reducesOnReceive(r.bytes) && r.bytes % dataTypeSize(r.dtype) == 0) {
      other[i].assign(r.bytes, 1);
      ReduceOnReceive rr;
      rr.dst = dst[i].data();
      rr.other = other[i].data();
      rr.receivedFirst = r.receivedFirst;
      rr.op = r.op;
      rr.dtype = r.dtype;
      rr.scalar = scalar;
      if (!conn.postRecvReduce(rr, r.bytes, r.tag, i).isOk()) failed = true;
    } else {
      r.reduce = false;
      if (!conn.postRecv(dst[i].data(), r.bytes, r.tag, i).isOk()) failed = true;
    }
  }
  auto collect = [&] {
    for (const Completion& c : done) {
      FUZZ_CHECK(c.token < recvs.size(), "completion of unknown token %llu", (unsigned long long)c.token);
      FUZZ_CHECK(!completed[c.token], "receive %llu completed twice", (unsigned long long)c.token);
      FUZZ_CHECK(c.bytes == recvs[c.token].bytes, "receive completed with %llu bytes, posted %llu",
                 (unsigned long long)c.bytes, (unsigned long long)recvs[c.token].bytes);
      completed[c.token] = true;
    }
  };
  auto pollUntilIdle = [&] {
    for (int guard = 0; guard < 100'000; ++guard) {
      bool moved = pollOnce();
      collect();
      if (!moved) return;
    }
    FUZZ_CHECK(false, "poll kept reporting progress");
  };

  // The peer's frames, written as its pumpSends would place them.
  struct Written {
    uint64_t tag, messageBytes;
    uint32_t frameBytes, kind;
  };
  std::vector<Written> written;
  const uint64_t capacity = creator.ringBytes / shm::kSlotBytes;
  uint64_t writtenSlots = 0, frames = 0;
  while (!in.empty() && capacity > 0 && !failed) {
    uint64_t tag = in.u64();
    uint64_t messageBytes = in.u64();
    uint32_t frameBytes = in.u32();
    uint32_t kind = in.u32();
    std::string_view payload = in.bytes(in.u16());
    uint64_t slots = kind == 1 ? 1 : (kFrameHeader + uint64_t{frameBytes} + shm::kSlotBytes - 1) / shm::kSlotBytes;
    if (slots > capacity) slots = capacity;
    // Wait for room as the sender does; give up when the receiver stalls.
    bool room = true;
    while (writtenSlots + slots - creator.control->consumedSlots.load(std::memory_order_acquire) > capacity) {
      if (!pollOnce()) {
        collect();
        room = writtenSlots + slots - creator.control->consumedSlots.load(std::memory_order_acquire) <= capacity;
        break;
      }
      collect();
    }
    if (!room || failed) break;
    uint64_t first = writtenSlots % capacity;
    uint8_t* slot = creator.ring + first * shm::kSlotBytes;
    std::memcpy(slot + 8, &tag, 8);
    std::memcpy(slot + 16, &messageBytes, 8);
    std::memcpy(slot + 24, &frameBytes, 4);
    std::memcpy(slot + 28, &kind, 4);
    std::string body(payload);
    if (kind == 1) {
      uint64_t address = 0;
      std::memcpy(&address, body.data(), body.size() < 8 ? body.size() : 8);
      if (address == 0) address = reinterpret_cast<uint64_t>(gSource);
      body.assign(reinterpret_cast<const char*>(&address), 8);
    }
    // The payload runs on from the header, wrapping at the end of the ring.
    uint64_t room0 = creator.ringBytes - (first * shm::kSlotBytes + kFrameHeader);
    uint64_t n = body.size() < creator.ringBytes - kFrameHeader ? body.size() : creator.ringBytes - kFrameHeader;
    uint64_t head = n < room0 ? n : room0;
    std::memcpy(slot + kFrameHeader, body.data(), head);
    if (head < n) std::memcpy(creator.ring, body.data() + head, n - head);
    reinterpret_cast<std::atomic<uint64_t>*>(slot)->store(++frames, std::memory_order_release);
    written.push_back({tag, messageBytes, frameBytes, kind});
    writtenSlots += slots;
    pollUntilIdle();
  }
  pollUntilIdle();

  // Receives match frames in order, and each frame must name its receive's
  // tag and size (else the connection fails): a receive whose frames do not
  // never completes, nor does any after it.
  size_t next = 0;
  bool broken = false;
  for (size_t i = 0; i < recvs.size(); ++i) {
    uint64_t offset = 0;
    bool ok = !broken;
    do {
      if (!ok || next >= written.size()) {
        ok = false;
        break;
      }
      const Written& w = written[next++];
      if (w.tag != recvs[i].tag || w.messageBytes != recvs[i].bytes) ok = false;
      else if (w.kind == 1) offset = recvs[i].bytes;
      else if (w.frameBytes > recvs[i].bytes - offset) ok = false;
      else offset += w.frameBytes;
    } while (ok && offset < recvs[i].bytes);
    if (!ok) broken = true;
    FUZZ_CHECK(!completed[i] || ok, "receive %zu completed although its frames do not match it", i);
  }

  if ((flags & 4) && creator.header != nullptr) {
    std::string reason = "peer failed: " + std::to_string(frames);
    size_t n = reason.size() < shm::kReasonBytes ? reason.size() : shm::kReasonBytes;
    std::memcpy(creator.header->reason[0], reason.data(), n);
    creator.header->reasonLength[0].store(static_cast<uint32_t>(n) | (frames << 20), std::memory_order_release);
    creator.header->closed[0].store(1, std::memory_order_release);
    for (int i = 0; i < 32 && !failed; ++i) pollOnce();
    (void)conn.peerFailure();
  }
  (void)conn.pending();
  return 0;
}
