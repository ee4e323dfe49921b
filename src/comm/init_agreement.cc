#include "comm/init_agreement.h"

#include <algorithm>
#include <cstdint>

#include "core/wire.h"

namespace shoal {
namespace {

enum MessageKind : uint8_t { kPeerRecord = 1, kInitProposal = 2, kSplitRecord = 3, kWindowRecord = 4, kWindowFlags = 5 };

// Longest field a message may carry (a PeerInfo is a few hundred bytes).
constexpr uint32_t kMaxFieldBytes = 1u << 20;
// An abstract Unix socket name fits in sockaddr_un's 107 bytes.
constexpr uint32_t kMaxSocketNameBytes = 107;

const uint8_t* bytesOf(std::string_view s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::string finished(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

// A reader past the message's kind byte, or a status saying why not.
Result<wire::Reader> openMessage(std::string_view bytes, MessageKind kind, const char* what) {
  wire::Reader r(bytesOf(bytes), bytes.size());
  const uint8_t found = r.u8();
  if (!r.ok() || found != kind)
    return internalError("malformed ", what, " (", bytes.size(), " bytes, kind ", static_cast<int>(found),
                         ", expected ", static_cast<int>(kind), ")");
  return r;
}

Status closed(const wire::Reader& r, const char* what) {
  if (!r.ok() || !r.atEnd()) return internalError("malformed ", what);
  return Status::ok();
}

// Whether every rank proposed a flag (false when there are none), and the
// first rank that did not where some did (-1 otherwise): whom the log names.
struct Unanimity {
  bool all = false;
  int firstWithout = -1;
};
Unanimity unanimity(const std::vector<InitProposal>& proposals, bool InitProposal::*flag) {
  bool any = false;
  int firstWithout = -1;
  for (size_t r = 0; r < proposals.size(); ++r) {
    if (proposals[r].*flag) any = true;
    else if (firstWithout < 0) firstWithout = static_cast<int>(r);
  }
  return any ? Unanimity{firstWithout < 0, firstWithout} : Unanimity{};
}

}  // namespace

std::string encodePeerRecord(const PeerRecord& record) {
  std::vector<uint8_t> bytes;
  wire::Writer w(bytes);
  w.u8(kPeerRecord);
  w.u32(static_cast<uint32_t>(record.nranks));
  w.str(record.info.serialize());
  w.u64(record.nonce);
  return finished(bytes);
}

Result<PeerRecord> decodePeerRecord(std::string_view bytes) {
  SHOAL_ASSIGN_OR_RETURN(wire::Reader r, openMessage(bytes, kPeerRecord, "peer record"));
  PeerRecord record;
  record.nranks = static_cast<int>(r.u32());
  const std::string info = r.str(kMaxFieldBytes);
  record.nonce = r.u64();
  SHOAL_TRY(closed(r, "peer record"));
  if (record.nranks < 1) return internalError("malformed peer record: nranks ", record.nranks);
  SHOAL_ASSIGN_OR_RETURN(record.info, PeerInfo::deserialize(info));
  return record;
}

std::string encodeInitProposal(const InitProposal& proposal) {
  std::vector<uint8_t> bytes;
  wire::Writer w(bytes);
  w.u8(kInitProposal);
  w.u8(proposal.readsEveryPeer ? 1 : 0);
  w.u8(proposal.deviceDirect ? 1 : 0);
  w.u8(proposal.streamPlans ? 1 : 0);
  w.u8(proposal.fewHardwareQueues ? 1 : 0);
  w.u8(proposal.synchronousStreams ? 1 : 0);
  w.u8(proposal.netLink ? 1 : 0);
  if (proposal.netLink) {
    w.str(proposal.netLink->transport);
    w.u8(proposal.netLink->cpuCopiesBytes ? 1 : 0);
    w.u8(proposal.netLink->emulatesMessagesOverSockets ? 1 : 0);
  }
  writeMachineFacts(w, proposal.machine);
  return finished(bytes);
}

Result<InitProposal> decodeInitProposal(std::string_view bytes) {
  SHOAL_ASSIGN_OR_RETURN(wire::Reader r, openMessage(bytes, kInitProposal, "init proposal"));
  InitProposal proposal;
  auto flag = [&r] {
    const uint8_t v = r.u8();
    return v <= 1 ? std::optional<bool>(v == 1) : std::nullopt;
  };
  const std::optional<bool> reads = flag();
  const std::optional<bool> deviceDirect = flag();
  const std::optional<bool> streamPlans = flag();
  const std::optional<bool> fewQueues = flag();
  const std::optional<bool> synchronous = flag();
  const std::optional<bool> hasLink = flag();
  bool flagsOk = reads && deviceDirect && streamPlans && fewQueues && synchronous && hasLink;
  if (flagsOk && *hasLink) {
    NetLink link;
    link.transport = r.str(kMaxFieldBytes);
    const std::optional<bool> copies = flag();
    const std::optional<bool> emulated = flag();
    flagsOk = copies && emulated && !link.transport.empty();
    link.cpuCopiesBytes = copies.value_or(false);
    link.emulatesMessagesOverSockets = emulated.value_or(false);
    proposal.netLink = std::move(link);
  }
  if (!r.ok() || !flagsOk) return internalError("malformed init proposal");
  proposal.readsEveryPeer = *reads;
  proposal.deviceDirect = *deviceDirect;
  proposal.streamPlans = *streamPlans;
  proposal.fewHardwareQueues = *fewQueues;
  proposal.synchronousStreams = *synchronous;
  SHOAL_ASSIGN_OR_RETURN(proposal.machine, readMachineFacts(r), "init proposal");
  SHOAL_TRY(closed(r, "init proposal"));
  return proposal;
}

Result<InitAgreement> agree(const std::vector<InitProposal>& proposals) {
  InitAgreement agreement;
  std::vector<MachineTopology> machines;
  machines.reserve(proposals.size());
  const Unanimity direct = unanimity(proposals, &InitProposal::deviceDirect);
  agreement.deviceDirect = direct.all;
  if (direct.firstWithout >= 0)
    agreement.notDeviceDirect = str("rank ", direct.firstWithout, " cannot move device memory to every peer");
  const Unanimity links = unanimity(proposals, &InitProposal::streamPlans);
  agreement.streamLinks = links.all;
  if (links.firstWithout >= 0)
    agreement.noStreamLinks = str("rank ", links.firstWithout, " does not run stream plans (SHOAL_CUDA_WAIT, "
                                  "SHOAL_CUDA_STREAM_PLANS, or its peers: see its INFO log)");
  for (size_t r = 0; r < proposals.size(); ++r) {
    const InitProposal& p = proposals[r];
    if (p.fewHardwareQueues && agreement.rankWithFewQueues < 0) agreement.rankWithFewQueues = static_cast<int>(r);
    if (p.synchronousStreams && agreement.rankSynchronous < 0) agreement.rankSynchronous = static_cast<int>(r);
    agreement.everyoneReadsPeers = agreement.everyoneReadsPeers && !agreement.deviceDirect && p.readsEveryPeer;
    if (p.netLink) {
      if (agreement.netLink && *agreement.netLink != *p.netLink)
        return internalError("two ranks proposed the network link (", agreement.netLink->transport, " and, from rank ",
                             r, ", ", p.netLink->transport, ")");
      agreement.netLink = p.netLink;
    }
    machines.push_back(p.machine);
  }
  agreement.machine = agreedMachine(machines);
  return agreement;
}

std::string encodeSplitRecord(const SplitRecord& record) {
  std::vector<uint8_t> bytes;
  wire::Writer w(bytes);
  w.u8(kSplitRecord);
  w.u32(static_cast<uint32_t>(record.color));
  w.u32(static_cast<uint32_t>(record.key));
  return finished(bytes);
}

Result<SplitRecord> decodeSplitRecord(std::string_view bytes) {
  SHOAL_ASSIGN_OR_RETURN(wire::Reader r, openMessage(bytes, kSplitRecord, "split record"));
  SplitRecord record;
  record.color = static_cast<int>(r.u32());
  record.key = static_cast<int>(r.u32());
  SHOAL_TRY(closed(r, "split record"));
  return record;
}

std::string encodeWindowRecord(const WindowRecord& record) {
  std::vector<uint8_t> bytes;
  wire::Writer w(bytes);
  w.u8(kWindowRecord);
  w.u64(record.address);
  w.u64(record.bytes);
  w.u8(record.deviceMemory ? 1 : 0);
  w.u32(static_cast<uint32_t>(record.pid));
  w.u64(record.pidNamespace);
  w.u64(record.sharedSequence);
  w.u64(record.sharedOffset);
  w.u64(record.deviceSerial);
  w.u64(record.deviceBytes);
  w.u64(record.deviceOffset);
  w.str(record.mailbox);
  w.u64(record.netNamespace);
  w.u32(record.uid);
  w.u8(record.symmetric ? 1 : 0);
  w.u64(record.boardAddress);
  return finished(bytes);
}

Result<WindowRecord> decodeWindowRecord(std::string_view bytes) {
  SHOAL_ASSIGN_OR_RETURN(wire::Reader r, openMessage(bytes, kWindowRecord, "window record"));
  WindowRecord record;
  record.address = r.u64();
  record.bytes = r.u64();
  const uint8_t device = r.u8();
  record.deviceMemory = device == 1;
  record.pid = static_cast<int32_t>(r.u32());
  record.pidNamespace = r.u64();
  record.sharedSequence = r.u64();
  record.sharedOffset = r.u64();
  record.deviceSerial = r.u64();
  record.deviceBytes = r.u64();
  record.deviceOffset = r.u64();
  record.mailbox = r.str(kMaxSocketNameBytes);
  record.netNamespace = r.u64();
  record.uid = r.u32();
  const uint8_t symmetric = r.u8();
  record.symmetric = symmetric == 1;
  record.boardAddress = r.u64();
  SHOAL_TRY(closed(r, "window record"));
  if (device > 1) return internalError("malformed window record: memory flag ", static_cast<int>(device));
  if (symmetric > 1) return internalError("malformed window record: symmetric flag ", static_cast<int>(symmetric));
  // Ranges a peer would map must lie inside what it maps.
  if (record.deviceSerial != 0 &&
      (record.deviceOffset > record.deviceBytes || record.bytes > record.deviceBytes - record.deviceOffset))
    return internalError("malformed window record: ", record.bytes, " bytes at ", record.deviceOffset,
                         " in an allocation of ", record.deviceBytes);
  return record;
}

std::string encodeWindowFlags(const WindowFlags& flags) {
  std::vector<uint8_t> bytes;
  wire::Writer w(bytes);
  w.u8(kWindowFlags);
  w.str(flags.error);
  w.u32(static_cast<uint32_t>(flags.flags.size()));
  for (bool f : flags.flags) w.u8(f ? 1 : 0);
  return finished(bytes);
}

Result<WindowFlags> decodeWindowFlags(std::string_view bytes) {
  SHOAL_ASSIGN_OR_RETURN(wire::Reader r, openMessage(bytes, kWindowFlags, "window flags"));
  WindowFlags flags;
  flags.error = r.str(kMaxFieldBytes);
  const uint32_t n = r.count(1);
  flags.flags.reserve(n);
  bool valuesOk = true;
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t v = r.u8();
    valuesOk = valuesOk && v <= 1;
    flags.flags.push_back(v == 1);
  }
  if (!valuesOk) return internalError("malformed window flags");
  SHOAL_TRY(closed(r, "window flags"));
  return flags;
}

}  // namespace shoal
