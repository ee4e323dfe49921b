// SHOAL_CHECK_MODE=1: before data moves, the ranks involved in a call compare
// its full signature (docs/nccl-compat.md, "Mismatched calls").
//
// Collectives: every rank contributes one fixed-size record (the number of
// collectives in its call or group, a hash of all their signatures, the first
// signature) to an AllGather over the communicator; any difference fails
// every rank with ncclInvalidUsage naming the ranks and both signatures.
// Send/Recv: each pair exchanges records in both directions (the sender's
// record travels with the data's direction, the receiver's back), so both
// sides see a mismatch of count or data type. The exchanges are ordinary
// operations of the communicator, run to completion on the calling thread.
#include "comm/call_check.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/params.h"
#include "core/status.h"

namespace shoal {
namespace {

constexpr uint32_t kRecordMagic = 0x53434b31;  // "SCK1"

// One call's signature as it travels (little-endian host layout; all ranks
// of a communicator run the same build).
struct Signature {
  uint32_t magic = kRecordMagic;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t pad = 0;
  int32_t root = -1;
  int32_t rank = -1;   // whose record
  int32_t peer = -1;   // Send/Recv: the other side
  uint32_t pad2 = 0;
  uint64_t count = 0;
  uint64_t divisor = 0;
};
static_assert(sizeof(Signature) == 40);

struct CollectiveRecord {
  uint64_t collectives = 0;
  uint64_t hash = 0;
  Signature first;
};

Signature signatureOf(const CollShape& s, int rank) {
  Signature sig;
  sig.kind = static_cast<uint8_t>(s.kind);
  sig.dtype = static_cast<uint8_t>(s.dtype);
  // PreMulSum's scalar may differ by rank (NCCL allows it); the operator may not.
  sig.op = static_cast<uint8_t>(s.op);
  sig.root = s.root;
  sig.rank = rank;
  sig.peer = s.peer;
  sig.count = s.count;
  sig.divisor = s.divisor;
  return sig;
}

bool sameCall(const Signature& a, const Signature& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.root == b.root &&
         a.count == b.count && a.divisor == b.divisor;
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

uint64_t hashOf(const Signature& s) {
  uint64_t h = 0;
  h = mix(h, s.kind);
  h = mix(h, s.dtype);
  h = mix(h, s.op);
  h = mix(h, static_cast<uint32_t>(s.root));
  h = mix(h, s.count);
  h = mix(h, s.divisor);
  return h;
}

bool isPointToPoint(CollKind k) { return k == CollKind::kSend || k == CollKind::kRecv; }

}  // namespace

std::string describeCall(const CollShape& s) {
  bool rooted = s.kind == CollKind::kBroadcast || s.kind == CollKind::kReduce ||
                s.kind == CollKind::kGather || s.kind == CollKind::kScatter;
  bool reduces = s.kind == CollKind::kAllReduce || s.kind == CollKind::kReduce ||
                 s.kind == CollKind::kReduceScatter;
  return str(collKindName(s.kind), "(count ", s.count, ", ", dataTypeName(s.dtype),
             reduces ? str(", ", reduceOpName(s.op), s.divisor > 1 ? " then divide" : "") : std::string(),
             rooted ? str(", root ", s.root) : std::string(),
             isPointToPoint(s.kind) ? str(s.kind == CollKind::kSend ? ", to rank " : ", from rank ", s.peer)
                                    : std::string(),
             ")");
}

static CollShape shapeOf(const Signature& sig) {
  CollShape s;
  s.kind = static_cast<CollKind>(sig.kind);
  s.dtype = static_cast<DataType>(sig.dtype);
  s.op = static_cast<ReduceOp>(sig.op);
  s.root = sig.root;
  s.peer = sig.peer;
  s.count = sig.count;
  s.divisor = sig.divisor;
  return s;
}

bool callCheckEnabled() {
  const std::string& mode = params().checkMode;
  return mode == "1" || mode == "full";
}

Status checkCallsAgree(Communicator& comm, std::span<const OpRequest> ops) {
  const int rank = comm.rank();
  const int nranks = comm.nranks();
  std::vector<OpRequest> exchange;

  // Collectives: one record per rank, gathered.
  CollectiveRecord mine;
  bool anyCollective = false;
  for (const OpRequest& op : ops) {
    if (isPointToPoint(op.shape.kind)) continue;
    Signature sig = signatureOf(op.shape, rank);
    if (!anyCollective) mine.first = sig;
    anyCollective = true;
    ++mine.collectives;
    mine.hash = mix(mine.hash, hashOf(sig));
  }
  mine.first.rank = rank;
  std::vector<CollectiveRecord> all(static_cast<size_t>(nranks));
  // Every rank takes part in the gather, also when its call has only
  // Send/Recv: a rank whose peers called a collective then sees it.
  const bool anyPointToPoint =
      std::any_of(ops.begin(), ops.end(), [](const OpRequest& op) { return isPointToPoint(op.shape.kind); });
  if (anyCollective || !anyPointToPoint) {
    OpRequest gather;
    gather.shape.kind = CollKind::kAllGather;
    gather.shape.dtype = DataType::kUint8;
    gather.shape.count = sizeof(CollectiveRecord);
    gather.sendbuff = &mine;
    gather.recvbuff = all.data();
    SHOAL_TRY(comm.submit(std::span<const OpRequest>(&gather, 1), /*wait=*/true))
        << "SHOAL_CHECK_MODE: exchanging call signatures";
    for (int r = 0; r < nranks; ++r) {
      const CollectiveRecord& theirs = all[static_cast<size_t>(r)];
      if (theirs.first.magic != kRecordMagic)
        return internalError("SHOAL_CHECK_MODE: malformed signature from rank ", r);
      if (theirs.collectives == mine.collectives && theirs.hash == mine.hash &&
          (mine.collectives == 0 || sameCall(theirs.first, mine.first)))
        continue;
      auto what = [](const CollectiveRecord& rec) {
        if (rec.collectives == 0) return std::string("no collective (Send/Recv only)");
        return str(describeCall(shapeOf(rec.first)),
                   rec.collectives > 1 ? str(" and ", rec.collectives - 1, " more in a group") : std::string());
      };
      return invalidUsage("SHOAL_CHECK_MODE: ranks called different collectives: rank ", rank,
                          " called ", what(mine), ", rank ", r, " called ", what(theirs));
    }
  }
  if (!anyPointToPoint) return Status::ok();

  // Send/Recv: records both ways between each pair, in two rounds so that
  // each round's messages between two ranks go one way and match in call
  // order, as the operations themselves do: first every send's record to its
  // receiver, then every receive's record back to its sender.
  std::vector<Signature> mineP2p(ops.size()), received(ops.size());
  for (int round = 0; round < 2; ++round) {
    exchange.clear();
    for (size_t k = 0; k < ops.size(); ++k) {
      const CollShape& s = ops[k].shape;
      if (!isPointToPoint(s.kind)) continue;
      mineP2p[k] = signatureOf(s, rank);
      OpRequest msg;
      msg.shape.dtype = DataType::kUint8;
      msg.shape.count = sizeof(Signature);
      msg.shape.peer = s.peer;
      const bool speaks = (s.kind == CollKind::kSend) == (round == 0);
      msg.shape.kind = speaks ? CollKind::kSend : CollKind::kRecv;
      if (speaks) msg.sendbuff = &mineP2p[k];
      else msg.recvbuff = &received[k];
      exchange.push_back(msg);
    }
    SHOAL_TRY(comm.submit(exchange, /*wait=*/true)) << "SHOAL_CHECK_MODE: exchanging Send/Recv signatures";
  }
  for (size_t k = 0; k < ops.size(); ++k) {
    const CollShape& s = ops[k].shape;
    if (!isPointToPoint(s.kind)) continue;
    const Signature& theirs = received[k];
    const bool paired = theirs.magic == kRecordMagic && theirs.rank == s.peer && theirs.peer == rank &&
                        theirs.kind != static_cast<uint8_t>(s.kind);
    if (paired && theirs.count == s.count && theirs.dtype == static_cast<uint8_t>(s.dtype)) continue;
    return invalidUsage("SHOAL_CHECK_MODE: Send/Recv do not match: rank ", rank, " called ",
                        describeCall(s), ", rank ", s.peer, " called ",
                        theirs.magic == kRecordMagic ? describeCall(shapeOf(theirs))
                                                     : std::string("something else"));
  }
  return Status::ok();
}

}  // namespace shoal
