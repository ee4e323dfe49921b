#include "transports/tcp/tcp_connection.h"

#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "core/byte_order.h"
#include "core/tag.h"
#include "net/socket.h"

namespace shoal::tcp {
namespace {

constexpr size_t kStageBytes = 64 << 10;
constexpr uint64_t kDirectBytes = 8 << 10;     // payloads this large skip the staging buffer
constexpr int kMaxIov = 64;                    // iovecs per writev
constexpr uint64_t kMaxWriteBytes = 16u << 20; // bytes offered to one writev
constexpr size_t kStageLookahead = 64;         // segments considered for one staged read
constexpr size_t kMaxPendingOps = 1u << 20;    // back-pressure beyond this

// Segment header: {u64 tag, u64 message bytes, u32 message number (low 32
// bits), u16 slice, u16 slices}, little-endian.
void encodeHeader(uint8_t* out, uint64_t tag, uint64_t bytes, uint64_t seq, uint16_t slice, uint16_t slices) {
  putLe(out, tag, 8);
  putLe(out + 8, bytes, 8);
  putLe(out + 16, seq, 4);
  putLe(out + 20, slice, 2);
  putLe(out + 22, slices, 2);
}

// A segment header with this tag (no operation's tag is 0: core/tag.h puts
// the collective kind + 1 in the top bits) says the peer closed its
// communicator: it left, it did not die. Its message bytes are those of the
// peer's failure report that follows (0: it destroyed or aborted it).
constexpr uint64_t kByeTag = 0;

// How long a receiver that met a bye waits for the rest of its report (sent
// with the header in one write, so normally there already).
constexpr int kReportWaitMs = 20;

}  // namespace

int sliceCount(uint64_t bytes, int lanes, uint64_t chunkBytes) {
  if (bytes <= chunkBytes || lanes <= 1) return 1;
  uint64_t chunks = (bytes + chunkBytes - 1) / chunkBytes;
  return static_cast<int>(std::min<uint64_t>(chunks, static_cast<uint64_t>(lanes)));
}

SlicePlan planSlice(uint64_t seq, uint64_t bytes, int lanes, uint64_t chunkBytes, int slice) {
  int slices = sliceCount(bytes, lanes, chunkBytes);
  SlicePlan plan;
  plan.lane = static_cast<int>((seq + static_cast<uint64_t>(slice)) % static_cast<uint64_t>(lanes));
  if (slices == 1) {
    plan.offset = 0;
    plan.length = bytes;
    return plan;
  }
  uint64_t chunks = (bytes + chunkBytes - 1) / chunkBytes;
  uint64_t first = chunks * static_cast<uint64_t>(slice) / static_cast<uint64_t>(slices);
  uint64_t last = chunks * static_cast<uint64_t>(slice + 1) / static_cast<uint64_t>(slices);
  plan.offset = first * chunkBytes;
  plan.length = std::min(last * chunkBytes, bytes) - plan.offset;
  return plan;
}

TcpConnection::TcpConnection(std::vector<net::Fd> lanes, uint64_t chunkBytes, std::string peerDescription)
    : chunkBytes_(chunkBytes > 0 ? chunkBytes : 131072),
      peer_(std::move(peerDescription)),
      silentMs_(net::silentAfterMs(net::LivenessOptions::fromParams())) {
  SHOAL_CHECK(!lanes.empty() && lanes.size() <= static_cast<size_t>(kMaxLanes), "lanes: ", lanes.size());
  lanes_.resize(lanes.size());
  for (size_t i = 0; i < lanes.size(); ++i) {
    lanes_[i].fd = std::move(lanes[i]);
    lanes_[i].stage = std::make_unique<uint8_t[]>(kStageBytes);
  }
}

TcpConnection::~TcpConnection() {
  // Best effort, never blocking: a bye on each socket with no segment half
  // sent (the peer reads it where it expects a header), so that an idle
  // peer's check (checkAlive) sees a peer that left, not one that died, and
  // its next operation says so (byeStatus), with this rank's failure report
  // if it has one.
  const std::string report = boundReport(ownReport_);
  uint8_t bye[kSegmentHeaderBytes];
  encodeHeader(bye, kByeTag, report.size(), UINT32_MAX, 0, 0);
  iovec parts[2] = {{bye, sizeof(bye)}, {const_cast<char*>(report.data()), report.size()}};
  for (Lane& lane : lanes_)
    if (lane.fd.valid() && (lane.sends.empty() || lane.sends.front().sent == 0))
      (void)net::writevSome(lane.fd.get(), parts, report.empty() ? 1 : 2);
}

std::string TcpConnection::boundReport(std::string_view report) {
  if (report.size() <= kMaxReportBytes) return std::string(report);
  constexpr std::string_view kCut = " [...] ";
  const size_t head = kMaxReportBytes / 4;
  const size_t tail = kMaxReportBytes - head - kCut.size();
  return str(report.substr(0, head), kCut, report.substr(report.size() - tail));
}

void TcpConnection::publishFailure(std::string_view reason, bool /*final*/) {
  std::lock_guard<std::mutex> lock(reportMutex_);
  // Only a report that extends the first replaces it (transport.h); kept
  // whole (bounded when sent), so that a long one can still be extended.
  if (reason.size() > ownReport_.size() && reason.substr(0, ownReport_.size()) == ownReport_)
    ownReport_ = std::string(reason);
}

std::string TcpConnection::peerFailure() const {
  std::lock_guard<std::mutex> lock(reportMutex_);
  return peerReport_;
}

Status TcpConnection::fail(Status status) {
  if (failure_.isOk()) failure_ = std::move(status);
  return failure_;
}

Status TcpConnection::checkAlive() {
  if (!failure_.isOk()) return failure_;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    Status s = net::checkIdleSocket(lanes_[i].fd.get(), silentMs_,
                                    lanes_.size() > 1 ? str(peer_, " socket ", i) : peer_);
    if (!s.isOk()) return fail(std::move(s));
  }
  return Status::ok();
}

// --- posting

Status TcpConnection::postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failure_.isOk()) return failure_;
  if (activeSends_ >= kMaxPendingOps) return error(Code::kAgain, peer_, ": send queue full");
  uint64_t seq = nextSendSeq_++;
  int lanes = laneCount();
  int slices = sliceCount(bytes, lanes, chunkBytes_);
  Op& op = sendOps_.push_back();
  op = Op{token, bytes, static_cast<uint32_t>(slices)};
  ++activeSends_;
  const auto* base = static_cast<const uint8_t*>(data);
  for (int j = 0; j < slices; ++j) {
    SlicePlan plan = planSlice(seq, bytes, lanes, chunkBytes_, j);
    SendSegment& segment = lanes_[plan.lane].sends.push_back();
    encodeHeader(segment.header, tag, bytes, seq, static_cast<uint16_t>(j), static_cast<uint16_t>(slices));
    segment.data = base + plan.offset;
    segment.length = plan.length;
    segment.sent = 0;
    segment.seq = seq;
    sendMask_ |= uint64_t{1} << plan.lane;
  }
  return Status::ok();
}

Status TcpConnection::postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failure_.isOk()) return failure_;
  if (activeRecvs_ >= kMaxPendingOps) return error(Code::kAgain, peer_, ": receive queue full");
  uint64_t seq = nextRecvSeq_++;
  int lanes = laneCount();
  int slices = sliceCount(bytes, lanes, chunkBytes_);
  Op& op = recvOps_.push_back();
  op = Op{token, bytes, static_cast<uint32_t>(slices)};
  ++activeRecvs_;
  auto* base = static_cast<uint8_t*>(data);
  for (int j = 0; j < slices; ++j) {
    SlicePlan plan = planSlice(seq, bytes, lanes, chunkBytes_, j);
    RecvSegment& segment = lanes_[plan.lane].recvs.push_back();
    segment = RecvSegment{tag, bytes, seq, static_cast<uint16_t>(j), static_cast<uint16_t>(slices),
                          base + plan.offset, plan.length, 0, false};
    recvMask_ |= uint64_t{1} << plan.lane;
  }
  return Status::ok();
}

// --- progress

Status TcpConnection::poll(std::vector<Completion>& done, bool& progressed) {
  if (!failure_.isOk()) return failure_;
  bool moved = false;
  for (uint64_t mask = sendMask_; mask != 0; mask &= mask - 1) {
    int index = __builtin_ctzll(mask);
    if (Status s = pumpSends(index, moved, done); !s.isOk()) {
      // The peer may have closed after a failure: its bye and report may
      // wait unread on a socket (its close reset this one).
      if (s.code() == Code::kRemoteError) {
        if (Status bye = findBye(); !bye.isOk()) return fail(std::move(bye));
      }
      return fail(std::move(s));
    }
  }
  for (uint64_t mask = recvMask_; mask != 0; mask &= mask - 1) {
    int index = __builtin_ctzll(mask);
    if (Status s = pumpRecvs(index, moved, done); !s.isOk()) return fail(std::move(s));
  }
  if (moved) progressed = true;
  return Status::ok();
}

void TcpConnection::finishSegment(Ring<Op>& ops, uint64_t& base, size_t& active, uint64_t seq,
                                  std::vector<Completion>& done) {
  Op& op = ops[static_cast<size_t>(seq - base)];
  if (--op.segmentsLeft > 0) return;
  done.push_back(Completion{op.token, op.bytes});
  --active;
  while (!ops.empty() && ops.front().segmentsLeft == 0) {
    ops.pop_front();
    ++base;
  }
}

Status TcpConnection::pumpSends(int index, bool& moved, std::vector<Completion>& done) {
  Lane& lane = lanes_[static_cast<size_t>(index)];
  while (!lane.sends.empty()) {
    iovec iov[kMaxIov];
    int count = 0;
    uint64_t offered = 0;
    for (size_t i = 0; i < lane.sends.size() && count + 2 <= kMaxIov && offered < kMaxWriteBytes; ++i) {
      SendSegment& segment = lane.sends[i];
      uint64_t at = segment.sent;
      if (at < kSegmentHeaderBytes) {
        iov[count++] = {segment.header + at, kSegmentHeaderBytes - at};
        offered += kSegmentHeaderBytes - at;
        at = kSegmentHeaderBytes;
      }
      uint64_t payloadAt = at - kSegmentHeaderBytes;
      if (payloadAt < segment.length) {
        uint64_t n = std::min(segment.length - payloadAt, kMaxWriteBytes);
        iov[count++] = {const_cast<uint8_t*>(segment.data + payloadAt), n};
        offered += n;
      }
    }
    net::IoResult io = net::writevSome(lane.fd.get(), iov, count);
    if (!io.ok()) return net::ioStatus(io, str(peer_, ": send"));
    if (io.bytes == 0) break;
    moved = true;
    uint64_t left = io.bytes;
    while (left > 0) {
      SendSegment& segment = lane.sends.front();
      uint64_t total = kSegmentHeaderBytes + segment.length;
      uint64_t take = std::min(left, total - segment.sent);
      segment.sent += take;
      left -= take;
      if (segment.sent < total) break;
      uint64_t seq = segment.seq;
      lane.sends.pop_front();
      finishSegment(sendOps_, sendBase_, activeSends_, seq, done);
    }
    if (io.bytes < offered) break;  // the kernel buffer is full
  }
  if (lane.sends.empty()) sendMask_ &= ~(uint64_t{1} << index);
  return Status::ok();
}

Result<TcpConnection::StageRead> TcpConnection::fillStage(Lane& lane) {
  // Bytes the posted segments still need from the stream, up to and including
  // the header of the first segment whose payload is read directly.
  uint64_t wanted = 0;
  size_t n = std::min(lane.recvs.size(), kStageLookahead);
  for (size_t i = 0; i < n && wanted < kStageBytes; ++i) {
    RecvSegment& segment = lane.recvs[i];
    if (!segment.headerDone) wanted += kSegmentHeaderBytes;
    uint64_t payloadLeft = segment.length - segment.have;
    if (payloadLeft >= kDirectBytes) break;
    wanted += payloadLeft;
  }
  size_t staged = lane.stageEnd - lane.stageStart;
  if (wanted <= staged) return StageRead{};
  if (lane.stageStart > 0 && lane.stageEnd + (wanted - staged) > kStageBytes) {
    std::memmove(lane.stage.get(), lane.stage.get() + lane.stageStart, staged);
    lane.stageStart = 0;
    lane.stageEnd = staged;
  }
  size_t room = kStageBytes - lane.stageEnd;
  size_t ask = static_cast<size_t>(std::min<uint64_t>(wanted - staged, room));
  if (ask == 0) return StageRead{};
  net::IoResult io = net::readSome(lane.fd.get(), lane.stage.get() + lane.stageEnd, ask);
  if (!io.ok()) return net::ioStatus(io, peer_);
  lane.stageEnd += io.bytes;
  return StageRead{io.bytes, io.bytes < ask};
}

Status TcpConnection::checkHeader(const Lane& lane, const RecvSegment& segment, int index) const {
  const uint8_t* h = lane.stage.get() + lane.stageStart;
  uint64_t tag = getLe(h, 8);
  uint64_t bytes = getLe(h + 8, 8);
  uint32_t seq = static_cast<uint32_t>(getLe(h + 16, 4));
  uint16_t slice = static_cast<uint16_t>(getLe(h + 20, 2));
  uint16_t slices = static_cast<uint16_t>(getLe(h + 22, 2));
  if (tag == segment.tag && bytes == segment.messageBytes && seq == static_cast<uint32_t>(segment.seq) &&
      slice == segment.slice && slices == segment.slices)
    return Status::ok();
  // Different collectives, sizes or counts of messages on the two sides.
  return invalidUsage(peer_, ": message mismatch at message #", segment.seq, ": the posted receive expects ",
                      describeTag(segment.tag), ", ", segment.messageBytes, " bytes; the peer sent ",
                      describeTag(tag), ", ", bytes, " bytes (its message #", seq, ", socket ", index, ")");
}

Status TcpConnection::pumpRecvs(int index, bool& moved, std::vector<Completion>& done) {
  Lane& lane = lanes_[static_cast<size_t>(index)];
  bool kernelDry = false;  // a read came back short: don't ask again in this poll
  while (!lane.recvs.empty()) {
    RecvSegment& segment = lane.recvs.front();
    size_t staged = lane.stageEnd - lane.stageStart;
    if (!segment.headerDone) {
      if (staged < kSegmentHeaderBytes) {
        if (kernelDry) break;
        SHOAL_ASSIGN_OR_RETURN(StageRead read, fillStage(lane));
        if (read.bytes == 0) break;
        moved = true;
        kernelDry = read.shortRead;
        continue;
      }
      if (getLe(lane.stage.get() + lane.stageStart, 8) == kByeTag) return byeStatus(lane, &segment);
      SHOAL_TRY(checkHeader(lane, segment, index));
      lane.stageStart += kSegmentHeaderBytes;
      staged -= kSegmentHeaderBytes;
      segment.headerDone = true;
    }
    uint64_t need = segment.length - segment.have;
    if (need > 0) {
      if (staged > 0) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(staged, need));
        std::memcpy(segment.data + segment.have, lane.stage.get() + lane.stageStart, n);
        lane.stageStart += n;
        segment.have += n;
      } else if (kernelDry) {
        break;
      } else if (need >= kDirectBytes) {
        net::IoResult io = net::readSome(lane.fd.get(), segment.data + segment.have, need);
        if (!io.ok()) return net::ioStatus(io, peer_);
        if (io.bytes == 0) break;
        moved = true;
        segment.have += io.bytes;
        if (io.bytes < need) kernelDry = true;
      } else {
        SHOAL_ASSIGN_OR_RETURN(StageRead read, fillStage(lane));
        if (read.bytes == 0) break;
        moved = true;
        kernelDry = read.shortRead;
      }
      if (segment.have < segment.length) continue;
    }
    uint64_t seq = segment.seq;
    lane.recvs.pop_front();
    finishSegment(recvOps_, recvBase_, activeRecvs_, seq, done);
  }
  if (lane.stageStart == lane.stageEnd) lane.stageStart = lane.stageEnd = 0;
  if (lane.recvs.empty()) recvMask_ &= ~(uint64_t{1} << index);
  return Status::ok();
}

Status TcpConnection::findBye() {
  for (Lane& lane : lanes_) {
    // Only where the next bytes are a header: nothing staged, no segment begun.
    if (lane.stageEnd != lane.stageStart || (!lane.recvs.empty() && lane.recvs.front().headerDone)) continue;
    uint8_t header[kSegmentHeaderBytes];
    ssize_t n = ::recv(lane.fd.get(), header, sizeof header, MSG_PEEK | MSG_DONTWAIT);
    if (n != static_cast<ssize_t>(sizeof header) || getLe(header, 8) != kByeTag) continue;
    lane.stageStart = lane.stageEnd = 0;
    net::IoResult io = net::readSome(lane.fd.get(), lane.stage.get(), sizeof header);
    if (!io.ok() || io.bytes != sizeof header) continue;
    lane.stageEnd = sizeof header;
    return byeStatus(lane, lane.recvs.empty() ? nullptr : &lane.recvs.front());
  }
  return Status::ok();
}

Status TcpConnection::byeStatus(Lane& lane, const RecvSegment* segment) {
  const uint64_t reportBytes = std::min<uint64_t>(getLe(lane.stage.get() + lane.stageStart + 8, 8), kMaxReportBytes);
  lane.stageStart += kSegmentHeaderBytes;
  std::string report;
  const size_t staged = std::min<size_t>(lane.stageEnd - lane.stageStart, reportBytes);
  report.append(reinterpret_cast<const char*>(lane.stage.get() + lane.stageStart), staged);
  lane.stageStart += staged;
  const Deadline deadline = Deadline::afterMs(kReportWaitMs);
  while (report.size() < reportBytes) {
    char buffer[4096];
    net::IoResult io = net::readSome(lane.fd.get(), buffer, std::min<size_t>(sizeof buffer, reportBytes - report.size()));
    if (!io.ok()) break;  // what came is what the peer managed to send
    if (io.bytes > 0) {
      report.append(buffer, io.bytes);
    } else if (Result<bool> readable = net::waitReadable(lane.fd.get(), deadline);
               !readable.isOk() || !readable.value()) {
      break;
    }
  }
  const bool failed = !report.empty();
  if (failed) {
    std::lock_guard<std::mutex> lock(reportMutex_);
    if (peerReport_.empty()) peerReport_ = std::move(report);
  }
  const std::string where =
      segment != nullptr ? str(" before message #", segment->seq, " (", describeTag(segment->tag), ")") : std::string();
  return remoteError(peer_, failed ? ": the peer's communicator failed and closed" + where
                                   : ": the peer closed its communicator (destroyed or aborted)" + where);
}

}  // namespace shoal::tcp
