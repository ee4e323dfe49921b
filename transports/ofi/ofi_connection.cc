#include "transports/ofi/ofi_connection.h"

#include <algorithm>
#include <thread>

#include "core/clock.h"
#include "core/log.h"
#include "core/tag.h"

namespace shoal::ofi {
namespace {

// How long a closing connection keeps driving its rail so that its bye leaves
// (manual progress: nobody else may poll this rail again).
constexpr int64_t kByeFlushMs = 100;
// How often a receive that waits looks for a message of another size in its
// place (FI_PEEK; see wire tags in ofi_fabric.h).
constexpr int64_t kPeekIntervalNs = 50 * 1000000ll;

}  // namespace

OfiConnection::OfiConnection(Rail& rail, std::vector<fi_addr_t> peerLanes, uint16_t railChannel, uint32_t recvId,
                             uint64_t injectLimit, ClearToSend clearToSend, std::string peerDescription)
    : rail_(rail),
      peerLanes_(std::move(peerLanes)),
      railChannel_(railChannel),
      recvId_(recvId),
      clearAbove_(clearToSend.above),
      clearanceMaxWaitNs_(clearToSend.maxWaitNs),
      injectLimit_(injectLimit),
      peer_(std::move(peerDescription)),
      peekable_(rail.peekWorks()) {}

Status OfiConnection::start(PeerHello expected) {
  SHOAL_CHECK(!peerLanes_.empty() && peerLanes_.size() <= static_cast<size_t>(rail_.endpointCount()),
              "ofi lanes: ", peerLanes_.size());
  expected_ = std::move(expected);
  // Exact-tag bye receives while the connection lives: a provider may match
  // a message that arrived before its receive only by its exact tag (shm),
  // so these, not only the rail's (Rail::byeSinks_), are there for a bye
  // that comes while nobody polls. Either one records it (Rail::byeArrived).
  Deadline deadline = Deadline::afterMs(1000);
  for (int lane = 0; lane < laneCount(); ++lane) {
    Op* bye = newOp();
    bye->kind = Op::Kind::kBye;
    bye->lane = static_cast<uint8_t>(lane);
    byes_.push_back(bye);
    for (;;) {
      ssize_t rc = fi_trecv(rail_.endpoint(lane), nullptr, 0, nullptr, FI_ADDR_UNSPEC, wire::byeTag(recvId_), 0,
                            &bye->context);
      if (rc == 0) break;
      if (rc != -FI_EAGAIN || deadline.expired())
        return systemError(peer_, ": ", fiError(rail_.api(), "fi_trecv (bye)", rc), " on endpoint ", lane);
      SHOAL_TRY(rail_.progress());
    }
    bye->posted = true;
  }
  peek_ = newOp();
  peek_->kind = Op::Kind::kPeek;
  peek_->owner = this;
  return Status::ok();
}

OfiConnection::~OfiConnection() {
  if (clearancesGivenUp_ > 0)
    SHOAL_INFO(subsys::kNet, "ofi: ", peer_, ": ", clearancesGivenUp_,
               " message part(s) sent without their clear-to-send (the receive came later than ",
               clearanceMaxWaitNs_ / 1000000, " ms)");
  std::unique_lock<std::mutex> lock(rail_.mutex);
  auto drop = [&](Op* op, bool cancel) {
    if (op == nullptr) return;
    // A truncated receive may still be finishing inside the provider (rxm
    // completes a rendezvous after reporting FI_ETRUNC): leave it to the rail.
    bool providerMayOwn = op->posted && (!op->done || op->error == FI_ETRUNC);
    if (providerMayOwn) {
      // The provider still owns its context: cancel a receive (a send cannot be
      // recalled) and let the rail free the Op on its completion.
      if (cancel) fi_cancel(&rail_.endpoint(op->lane)->fid, &op->context);
      rail_.adoptOrphan(op);
    } else {
      rail_.releaseRegistration(*op);
      delete op;
    }
  };
  for (Op* op : sends_.ops) drop(op, false);
  for (Op* op : recvs_.ops) drop(op, true);
  for (Op* op : clearances_) drop(op, true);
  for (Op* op : abandonedClearances_) drop(op, true);
  // The peer is gone when it said so on every lane (the rail receives byes).
  bool peerGone = true;
  for (int lane = 0; lane < laneCount(); ++lane) peerGone = peerGone && rail_.byeArrived(recvId_, lane);
  for (Op* bye : byes_) drop(bye, true);  // a later bye meets the rail's receives
  drop(peek_, false);
  for (Op* op : spare_) delete op;
  // Tell the peer, on every lane, so that it fails instead of waiting for us
  // (a bye follows this lane's data, not the other lanes'). Also where it
  // said bye first: its rail drains what we sent its connection until ours
  // comes (Rail::retireId, over the providers where ours drains too: both
  // sides run one); but then nobody waits on us, so the byes are not waited
  // for (its process may have exited since).
  if (peerRecvId_ != 0 && (!peerGone || rail_.drainsRetiredIds())) {
    Deadline flush = Deadline::afterMs(kByeFlushMs);
    size_t before = rail_.controlSendsInFlight();
    Status sent;
    for (int lane = 0; lane < laneCount() && (sent.isOk() || sent.code() == Code::kAgain); ++lane) {
      do {
        sent = rail_.sendControl(lane, peerLanes_[static_cast<size_t>(lane)], wire::byeTag(peerRecvId_), nullptr, 0);
        if (sent.code() == Code::kAgain) (void)rail_.progress();
      } while (sent.code() == Code::kAgain && !flush.expired());
    }
    // Drive the rail briefly so that the byes leave even if no one polls it again.
    while (!peerGone && sent.isOk() && rail_.controlSendsInFlight() > before && !flush.expired()) {
      if (!rail_.progress().isOk()) break;
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  }
  rail_.retireId(recvId_, laneCount());
}

Op* OfiConnection::newOp() {
  if (spare_.empty()) return new Op();
  Op* op = spare_.back();
  spare_.pop_back();
  op->reset();
  return op;
}

void OfiConnection::recycle(Op* op) {
  rail_.releaseRegistration(*op);
  op->reset();
  spare_.push_back(op);
}

Status OfiConnection::fail(Status status) {
  if (failure_.isOk()) failure_ = std::move(status);
  return failure_;
}

void OfiConnection::plan(Queue& queue, Op::Kind kind, void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  const uint64_t lanes = peerLanes_.size();
  if (queue.laneSeqs.size() != lanes) queue.laneSeqs.assign(lanes, 0);
  const uint64_t seq = queue.nextSeq++;
  const uint64_t parts = wire::stripeCount(bytes, lanes);
  const uint64_t sizeBits = wire::sizeBits(bytes, parts);
  for (uint64_t j = 0; j < parts; ++j) {
    wire::Part part = wire::part(bytes, parts, j);
    Op* op = newOp();
    op->kind = kind;
    op->owner = this;
    op->lane = static_cast<uint8_t>(wire::partLane(railChannel_, j, lanes));
    op->data = static_cast<uint8_t*>(data) + part.offset;
    op->bytes = part.bytes;
    op->tag = tag;
    op->token = token;
    op->seq = seq;
    op->laneSeq = queue.laneSeqs[op->lane]++;
    op->messageBytes = bytes;
    op->sizeBits = sizeBits;
    op->last = j + 1 == parts;
    if (kind == Op::Kind::kSend && clearAbove_ > 0 && op->bytes > clearAbove_) {
      Op* clearance = newOp();
      clearance->kind = Op::Kind::kClearance;
      clearance->owner = this;
      clearance->lane = op->lane;
      clearance->seq = seq;
      clearance->laneSeq = op->laneSeq;
      op->clearance = clearance;
      clearances_.push_back(clearance);
      ++clearancesUnposted_;
    }
    ++partsOnLane_[op->lane];
    queue.ops.push_back(op);
    ++queue.unposted;
  }
  ++pendingMessages_;
}

Status OfiConnection::postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failure_.isOk()) return failure_;
  if (bytes > rail_.maxMessageBytes())
    return fail(error(Code::kUnsupported, peer_, ": a message of ", bytes, " bytes exceeds the provider's limit of ",
                      rail_.maxMessageBytes()));
  plan(sends_, Op::Kind::kSend, const_cast<void*>(data), bytes, tag, token);
  std::lock_guard<std::mutex> lock(rail_.mutex);
  SHOAL_TRY(postClearanceRecvs());
  return issue(sends_);
}

Status OfiConnection::postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failure_.isOk()) return failure_;
  if (recvs_.ops.empty()) nextPeekNs_ = nowNs() + kPeekIntervalNs;
  plan(recvs_, Op::Kind::kRecv, data, bytes, tag, token);
  std::lock_guard<std::mutex> lock(rail_.mutex);
  SHOAL_TRY(issue(recvs_));
  return sendClearances();
}

bool OfiConnection::resolvePeer() {
  if (peerRecvId_ != 0) return true;
  wire::Hello hello;
  if (!rail_.takeHello(expected_.commId, expected_.peerRank, expected_.selfRank, expected_.channel, expected_.secret,
                       hello))
    return false;
  peerRecvId_ = hello.recvId;
  peerClearAbove_ = hello.clearAbove;
  return true;
}

Status OfiConnection::issue(Queue& queue) {
  if (&queue == &sends_ && queue.unposted > 0 && !resolvePeer()) return Status::ok();  // poll() retries
  while (queue.unposted > 0) {
    Op& op = *queue.ops[queue.ops.size() - queue.unposted];
    if (op.clearance != nullptr) {
      if (!op.clearance->done && !giveUpClearance(op)) return Status::ok();  // the receiver has not posted it yet
      if (op.clearance != nullptr && op.clearance->error != 0)
        return fail(remoteError(peer_, ": waiting to send message #", op.seq, ": ", op.clearance->errorText));
    }
    Status s = issueOne(op);
    if (s.code() == Code::kAgain) return Status::ok();  // queued; poll() retries
    if (!s.isOk()) return fail(std::move(s));
    --queue.unposted;
    if (&queue == &sends_) clearanceWaitSinceNs_ = 0;  // a new send heads the queue
    if (op.clearance != nullptr) {
      // Only now: a send the provider pushed back still needs its clearance.
      SHOAL_CHECK(!clearances_.empty() && clearances_.front() == op.clearance, "ofi clearances out of order");
      clearances_.pop_front();
      recycle(op.clearance);
      op.clearance = nullptr;
    } else if (op.kind == Op::Kind::kRecv && op.bytes > 0 &&
               (peerRecvId_ == 0 || (peerClearAbove_ > 0 && op.bytes > peerClearAbove_))) {
      // Owed to a peer that wants it, or may (its hello not claimed yet).
      owedClearances_.push_back(OwedClearance{op.lane, op.laneSeq, op.bytes});
    }
  }
  return Status::ok();
}

bool OfiConnection::giveUpClearance(Op& op) {
  if (clearanceMaxWaitNs_ < 0) return false;
  int64_t now = nowNs();
  if (clearanceWaitSinceNs_ == 0) clearanceWaitSinceNs_ = now;
  if (now - clearanceWaitSinceNs_ < clearanceMaxWaitNs_ || !op.clearance->posted) return false;
  SHOAL_CHECK(!clearances_.empty() && clearances_.front() == op.clearance, "ofi clearances out of order");
  clearances_.pop_front();
  abandonedClearances_.push_back(op.clearance);
  ++clearancesGivenUp_;
  op.clearance = nullptr;
  return true;
}

Status OfiConnection::postClearanceRecvs() {
  while (clearancesUnposted_ > 0) {
    Op& op = *clearances_[clearances_.size() - clearancesUnposted_];
    ssize_t rc = fi_trecv(rail_.endpoint(op.lane), nullptr, 0, nullptr, FI_ADDR_UNSPEC,
                          wire::clearTag(recvId_, op.laneSeq), 0, &op.context);
    if (rc == -FI_EAGAIN) return Status::ok();  // poll() retries
    if (rc != 0)
      return fail(remoteError(peer_, ": message #", op.seq, ": ", fiError(rail_.api(), "fi_trecv (clearance)", rc)));
    op.posted = true;
    --clearancesUnposted_;
  }
  return Status::ok();
}

Status OfiConnection::sendClearances() {
  if (owedClearances_.empty() || !resolvePeer()) return Status::ok();
  while (!owedClearances_.empty()) {
    const OwedClearance& owed = owedClearances_.front();
    if (peerClearAbove_ > 0 && owed.bytes > peerClearAbove_) {
      Status s = rail_.sendControl(owed.lane, peerLanes_[owed.lane], wire::clearTag(peerRecvId_, owed.laneSeq),
                                   nullptr, 0);
      if (s.code() == Code::kAgain) return Status::ok();  // poll() retries
      if (!s.isOk()) return fail(s.withContext(str(peer_, ": clear-to-send")));
    }
    owedClearances_.pop_front();
  }
  return Status::ok();
}

Status OfiConnection::issueOne(Op& op) {
  // Never inline from device memory: the provider would read it with the
  // CPU. describe() registers it or refuses it with the reason.
  bool inject = op.kind == Op::Kind::kSend && op.bytes <= injectLimit_ && !rail_.isDeviceMemory(op.data);
  if (op.mr == nullptr && !inject) {
    Status described = rail_.describe(op);
    if (!described.isOk()) return described.withContext(str(peer_, ": message #", op.seq));
  }
  void* desc = op.mr ? fi_mr_desc(op.mr->mr) : nullptr;
  fid_ep* ep = rail_.endpoint(op.lane);
  ssize_t rc;
  const char* call;
  if (op.kind == Op::Kind::kSend) {
    uint64_t wireTag = wire::dataTagWithBits(peerRecvId_, op.laneSeq, op.sizeBits);
    fi_addr_t to = peerLanes_[op.lane];
    if (inject) {
      // Inline: the provider copies the bytes now and reports no completion.
      call = "fi_tinjectdata";
      rc = fi_tinjectdata(ep, op.data, op.bytes, op.tag, to, wireTag);
      if (rc == 0) op.done = true;
    } else {
      call = "fi_tsenddata";
      rc = fi_tsenddata(ep, op.data, op.bytes, desc, op.tag, to, wireTag, &op.context);
    }
  } else {
    call = "fi_trecv";
    uint64_t wireTag = wire::dataTagWithBits(recvId_, op.laneSeq, op.sizeBits);
    rc = fi_trecv(ep, op.data, op.bytes, desc, FI_ADDR_UNSPEC, wireTag, 0, &op.context);
  }
  if (rc == -FI_EAGAIN) return error(Code::kAgain, call);
  if (rc != 0) return remoteError(peer_, ": message #", op.seq, ": ", fiError(rail_.api(), call, rc));
  op.posted = true;
  return Status::ok();
}

Status OfiConnection::poll(std::vector<Completion>& done, bool& progressed) {
  if (!failure_.isOk()) return failure_;
  if (pendingMessages_ == 0) return Status::ok();  // idle: no call into the provider
  std::lock_guard<std::mutex> lock(rail_.mutex);
  for (int lane = 0; lane < laneCount(); ++lane) {
    // Endpoint 0 also while the peer's hello is unclaimed: it arrives there.
    if (partsOnLane_[lane] == 0 && (lane != 0 || peerRecvId_ != 0)) continue;
    if (Status s = rail_.progress(lane); !s.isOk()) return fail(s.withContext(peer_));
  }
  SHOAL_TRY(postClearanceRecvs());
  if (sends_.unposted > 0) {
    SHOAL_TRY(issue(sends_));
  }
  if (recvs_.unposted > 0) {
    SHOAL_TRY(issue(recvs_));
  }
  SHOAL_TRY(sendClearances());
  while (!sends_.ops.empty() && sends_.ops.front()->done) {
    Op* op = sends_.ops.front();
    if (op->error != 0)
      return fail(remoteError(peer_, ": send of message #", op->seq, " (", op->messageBytes, " bytes) failed: ",
                              op->errorText));
    if (op->last) {
      done.push_back(Completion{op->token, op->messageBytes});
      --pendingMessages_;
    }
    --partsOnLane_[op->lane];
    noteLaneTraffic(op->lane);
    sends_.ops.pop_front();
    recycle(op);
    progressed = true;
  }
  while (!recvs_.ops.empty() && recvs_.ops.front()->done) {
    Op* op = recvs_.ops.front();
    if (Status s = finishRecv(*op); !s.isOk()) return fail(std::move(s));
    if (op->last) {
      done.push_back(Completion{op->token, op->messageBytes});
      --pendingMessages_;
    }
    --partsOnLane_[op->lane];
    noteLaneTraffic(op->lane);
    recvs_.ops.pop_front();
    recycle(op);
    progressed = true;
    nextPeekNs_ = nowNs() + kPeekIntervalNs;
  }
  while (!abandonedClearances_.empty() && abandonedClearances_.front()->done) {  // arrived after all
    recycle(abandonedClearances_.front());
    abandonedClearances_.pop_front();
  }
  SHOAL_TRY(peekForMismatch());
  return checkByes();
}

Status OfiConnection::checkAlive() {
  if (!failure_.isOk()) return failure_;
  std::lock_guard<std::mutex> lock(rail_.mutex);
  if (Status s = rail_.progress(0); !s.isOk()) return fail(s.withContext(peer_));
  return checkByeReceives();
}

Status OfiConnection::checkByeReceives() {
  for (const Op* bye : byes_)
    if (bye->done && bye->error != 0) return fail(remoteError(peer_, ": the connection failed: ", bye->errorText));
  return Status::ok();
}

bool OfiConnection::peerClosed() {
  std::lock_guard<std::mutex> lock(rail_.mutex);
  (void)rail_.progress(0);  // what came since the last look (an error is checkAlive's to report)
  for (int lane = 0; lane < laneCount(); ++lane)
    if (rail_.byeArrived(recvId_, lane)) return true;
  return false;
}

Status OfiConnection::checkByes() {
  if (pendingMessages_ == 0) return Status::ok();
  SHOAL_TRY(checkByeReceives());
  for (int lane = 0; lane < laneCount(); ++lane) {
    if (!rail_.byeArrived(recvId_, lane)) continue;
    // Everything the peer sent on this lane before its bye has been delivered
    // by now (send-after-send order per endpoint pair), so what still waits on
    // this lane never will complete.
    auto onLane = [&](const Op* op) { return op->lane == lane && !op->done; };
    if (std::any_of(sends_.ops.begin(), sends_.ops.end(), onLane) ||
        std::any_of(recvs_.ops.begin(), recvs_.ops.end(), onLane))
      return fail(remoteError(peer_, ": connection closed by the peer with ", pending(),
                              pending() == 1 ? " operation" : " operations", " pending"));
  }
  return Status::ok();
}

Status OfiConnection::peekForMismatch() {
  if (recvs_.ops.empty() || recvs_.ops.front()->done || !peekable_ || peek_ == nullptr) return Status::ok();
  const Op& front = *recvs_.ops.front();
  if (peek_->posted && peek_->done) {
    peek_->posted = false;
    if (peek_->error == 0 && peek_->seq == front.seq && peek_->lane == front.lane &&
        (peek_->gotTag & wire::kSizeMask) != front.sizeBits) {
      // What sits in the place of this part is (part 0 of) a message of another size.
      uint64_t sentBytes = wire::sentBytes(peek_->gotTag & wire::kSizeMask, peek_->gotBytes, peerLanes_.size());
      std::string sent = peek_->gotDataValid ? describeTag(peek_->gotData) : std::string("a message (tag not reported)");
      return fail(invalidUsage(peer_, ": message mismatch at message #", front.seq, ": the posted receive expects ",
                               describeTag(front.tag), ", ", front.messageBytes, " bytes; the peer sent ", sent, ", ",
                               sentBytes, " bytes"));
    }
    if (peek_->error == FI_ENOSYS || peek_->error == FI_EOPNOTSUPP) peekable_ = false;
  }
  if (peek_->posted) return Status::ok();
  int64_t now = nowNs();
  if (now < nextPeekNs_) return Status::ok();
  nextPeekNs_ = now + kPeekIntervalNs;
  peek_->reset();
  peek_->kind = Op::Kind::kPeek;
  peek_->owner = this;
  peek_->seq = front.seq;
  peek_->lane = front.lane;
  fi_msg_tagged msg{};
  msg.addr = FI_ADDR_UNSPEC;
  msg.tag = wire::dataTagWithBits(recvId_, front.laneSeq, 0);
  msg.ignore = wire::kSizeMask;
  msg.context = &peek_->context;
  ssize_t rc = fi_trecvmsg(rail_.endpoint(front.lane), &msg, FI_PEEK);
  if (rc == -FI_EAGAIN) return Status::ok();
  if (rc != 0) {
    // Without peeking a size mismatch is found by the engine's deadline.
    SHOAL_INFO(subsys::kNet, "ofi: ", peer_, ": FI_PEEK unavailable (", fiError(rail_.api(), "fi_trecvmsg", rc), ")");
    peekable_ = false;
    return Status::ok();
  }
  peek_->posted = true;
  return Status::ok();
}

Status OfiConnection::finishRecv(const Op& op) const {
  if (op.error != 0 && op.error != FI_ETRUNC)
    return remoteError(peer_, ": receive of message #", op.seq, " (", op.messageBytes, " bytes) failed: ",
                       op.errorText);
  if (!op.gotDataValid)
    return internalError(peer_, ": message #", op.seq, " arrived without its tag (no immediate data)");
  bool truncated = op.error == FI_ETRUNC;
  // On FI_ETRUNC providers differ: len is what landed (then + olen is what was
  // sent) or what was sent (rxm's rendezvous).
  uint64_t sentBytes = truncated && op.gotBytes <= op.bytes ? op.gotBytes + op.overflow : op.gotBytes;
  if (op.gotData == op.tag && sentBytes == op.bytes && !truncated) return Status::ok();
  // Parts of one size match only parts of messages of the same size, so a
  // part of another size is a hash collision; report what this part saw.
  std::string sent = truncated && op.overflow == 0 ? str("more than ", op.bytes) : str(sentBytes);
  std::string expected = op.bytes == op.messageBytes ? str(op.bytes) : str(op.bytes, " of ", op.messageBytes);
  return invalidUsage(peer_, ": message mismatch at message #", op.seq, ": the posted receive expects ",
                      describeTag(op.tag), ", ", expected, " bytes; the peer sent ", describeTag(op.gotData), ", ",
                      sent, " bytes");
}

}  // namespace shoal::ofi
