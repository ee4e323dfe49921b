#include "transports/ofi/ofi_connection.h"

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

OfiConnection::OfiConnection(Rail& rail, fi_addr_t peer, uint32_t recvId, uint64_t injectLimit,
                             std::string peerDescription)
    : rail_(rail),
      peerAddress_(peer),
      recvId_(recvId),
      injectLimit_(injectLimit),
      peer_(std::move(peerDescription)),
      peekable_(rail.peekWorks()) {}

Status OfiConnection::start(PeerHello expected) {
  expected_ = std::move(expected);
  bye_ = newOp();
  bye_->kind = Op::Kind::kBye;
  Deadline deadline = Deadline::afterMs(1000);
  for (;;) {
    ssize_t rc = fi_trecv(rail_.endpoint(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, wire::byeTag(recvId_), 0,
                          &bye_->context);
    if (rc == 0) break;
    if (rc != -FI_EAGAIN || deadline.expired())
      return systemError(peer_, ": ", fiError(rail_.api(), "fi_trecv (bye)", rc));
    SHOAL_TRY(rail_.progress());
  }
  bye_->posted = true;
  peek_ = newOp();
  peek_->kind = Op::Kind::kPeek;
  peek_->owner = this;
  return Status::ok();
}

OfiConnection::~OfiConnection() {
  std::unique_lock<std::mutex> lock(rail_.mutex);
  auto drop = [&](Op* op, bool cancel) {
    if (op == nullptr) return;
    // A truncated receive may still be finishing inside the provider (rxm
    // completes a rendezvous after reporting FI_ETRUNC): leave it to the rail.
    bool providerMayOwn = op->posted && (!op->done || op->error == FI_ETRUNC);
    if (providerMayOwn) {
      // The provider still owns its context: cancel a receive (a send cannot be
      // recalled) and let the rail free the Op on its completion.
      if (cancel) fi_cancel(&rail_.endpoint()->fid, &op->context);
      rail_.adoptOrphan(op);
    } else {
      rail_.releaseRegistration(*op);
      delete op;
    }
  };
  for (Op* op : sends_) drop(op, false);
  for (Op* op : recvs_) drop(op, true);
  bool peerGone = bye_ == nullptr || bye_->done;
  drop(bye_, true);
  drop(peek_, false);
  for (Op* op : spare_) delete op;
  // Tell the peer, so that it fails instead of waiting for us.
  if (peerRecvId_ != 0 && !peerGone) {
    Deadline flush = Deadline::afterMs(kByeFlushMs);
    size_t before = rail_.controlSendsInFlight();
    Status sent;
    do {
      sent = rail_.sendControl(peerAddress_, wire::byeTag(peerRecvId_), nullptr, 0);
      if (sent.code() == Code::kAgain) (void)rail_.progress();
    } while (sent.code() == Code::kAgain && !flush.expired());
    // Drive the rail briefly so that the bye leaves even if no one polls it again.
    while (sent.isOk() && rail_.controlSendsInFlight() > before && !flush.expired()) {
      if (!rail_.progress().isOk()) break;
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  }
  rail_.releaseId(recvId_);
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

Status OfiConnection::postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failure_.isOk()) return failure_;
  if (bytes > rail_.maxMessageBytes())
    return fail(error(Code::kUnsupported, peer_, ": a message of ", bytes, " bytes exceeds the provider's limit of ",
                      rail_.maxMessageBytes()));
  Op* op = newOp();
  op->kind = Op::Kind::kSend;
  op->owner = this;
  op->data = const_cast<void*>(data);
  op->bytes = bytes;
  op->tag = tag;
  op->token = token;
  op->seq = nextSendSeq_++;
  sends_.push_back(op);
  ++unpostedSends_;
  std::lock_guard<std::mutex> lock(rail_.mutex);
  return issue(sends_, unpostedSends_);
}

Status OfiConnection::postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) {
  if (!failure_.isOk()) return failure_;
  Op* op = newOp();
  op->kind = Op::Kind::kRecv;
  op->owner = this;
  op->data = data;
  op->bytes = bytes;
  op->tag = tag;
  op->token = token;
  op->seq = nextRecvSeq_++;
  if (recvs_.empty()) nextPeekNs_ = nowNs() + kPeekIntervalNs;
  recvs_.push_back(op);
  ++unpostedRecvs_;
  std::lock_guard<std::mutex> lock(rail_.mutex);
  return issue(recvs_, unpostedRecvs_);
}

bool OfiConnection::resolvePeer() {
  if (peerRecvId_ != 0) return true;
  wire::Hello hello;
  if (!rail_.takeHello(expected_.commId, expected_.peerRank, expected_.selfRank, expected_.channel, expected_.secret,
                       hello))
    return false;
  peerRecvId_ = hello.recvId;
  return true;
}

Status OfiConnection::issue(std::deque<Op*>& ops, size_t& unposted) {
  if (&ops == &sends_ && unposted > 0 && !resolvePeer()) return Status::ok();  // poll() retries
  while (unposted > 0) {
    Op& op = *ops[ops.size() - unposted];
    Status s = issueOne(op);
    if (s.code() == Code::kAgain) return Status::ok();  // queued; poll() retries
    if (!s.isOk()) return fail(std::move(s));
    --unposted;
  }
  return Status::ok();
}

Status OfiConnection::issueOne(Op& op) {
  bool inject = op.kind == Op::Kind::kSend && op.bytes <= injectLimit_;
  if (op.mr == nullptr && !inject) {
    Status described = rail_.describe(op);
    if (!described.isOk()) return described.withContext(str(peer_, ": message #", op.seq));
  }
  void* desc = op.mr ? fi_mr_desc(op.mr->mr) : nullptr;
  fid_ep* ep = rail_.endpoint();
  ssize_t rc;
  const char* call;
  if (op.kind == Op::Kind::kSend) {
    uint64_t wireTag = wire::dataTag(peerRecvId_, op.seq, op.bytes);
    if (inject) {
      // Inline: the provider copies the bytes now and reports no completion.
      call = "fi_tinjectdata";
      rc = fi_tinjectdata(ep, op.data, op.bytes, op.tag, peerAddress_, wireTag);
      if (rc == 0) op.done = true;
    } else {
      call = "fi_tsenddata";
      rc = fi_tsenddata(ep, op.data, op.bytes, desc, op.tag, peerAddress_, wireTag, &op.context);
    }
  } else {
    call = "fi_trecv";
    rc = fi_trecv(ep, op.data, op.bytes, desc, FI_ADDR_UNSPEC, wire::dataTag(recvId_, op.seq, op.bytes), 0,
                  &op.context);
  }
  if (rc == -FI_EAGAIN) return error(Code::kAgain, call);
  if (rc != 0) return remoteError(peer_, ": message #", op.seq, ": ", fiError(rail_.api(), call, rc));
  op.posted = true;
  return Status::ok();
}

Status OfiConnection::poll(std::vector<Completion>& done, bool& progressed) {
  if (!failure_.isOk()) return failure_;
  if (sends_.empty() && recvs_.empty()) return Status::ok();  // idle: no call into the provider
  std::lock_guard<std::mutex> lock(rail_.mutex);
  if (Status s = rail_.progress(); !s.isOk()) return fail(s.withContext(peer_));
  if (unpostedSends_ > 0) {
    SHOAL_TRY(issue(sends_, unpostedSends_));
  }
  if (unpostedRecvs_ > 0) {
    SHOAL_TRY(issue(recvs_, unpostedRecvs_));
  }
  while (!sends_.empty() && sends_.front()->done) {
    Op* op = sends_.front();
    if (op->error != 0)
      return fail(remoteError(peer_, ": send of message #", op->seq, " (", op->bytes, " bytes) failed: ",
                              op->errorText));
    done.push_back(Completion{op->token, op->bytes});
    sends_.pop_front();
    recycle(op);
    progressed = true;
  }
  while (!recvs_.empty() && recvs_.front()->done) {
    Op* op = recvs_.front();
    if (Status s = finishRecv(*op); !s.isOk()) return fail(std::move(s));
    done.push_back(Completion{op->token, op->bytes});
    recvs_.pop_front();
    recycle(op);
    progressed = true;
    nextPeekNs_ = nowNs() + kPeekIntervalNs;
  }
  SHOAL_TRY(peekForMismatch());
  // Everything the peer sent before its bye has been delivered by now (the
  // endpoint keeps send-after-send order), so what is still pending never will be.
  if (bye_->done && pending() > 0) {
    if (bye_->error != 0)
      return fail(remoteError(peer_, ": the connection failed: ", bye_->errorText));
    return fail(remoteError(peer_, ": connection closed by the peer with ", pending(),
                            pending() == 1 ? " operation" : " operations", " pending"));
  }
  return Status::ok();
}

Status OfiConnection::peekForMismatch() {
  if (recvs_.empty() || recvs_.front()->done || !peekable_ || peek_ == nullptr) return Status::ok();
  const Op& front = *recvs_.front();
  if (peek_->posted && peek_->done) {
    peek_->posted = false;
    if (peek_->error == 0 && peek_->seq == front.seq &&
        (peek_->gotTag & wire::kSizeMask) != wire::sizeHash(front.bytes)) {
      std::string sent = peek_->gotDataValid ? describeTag(peek_->gotData) : std::string("a message (tag not reported)");
      return fail(invalidUsage(peer_, ": message mismatch at message #", front.seq, ": the posted receive expects ",
                               describeTag(front.tag), ", ", front.bytes, " bytes; the peer sent ", sent, ", ",
                               peek_->gotBytes, " bytes"));
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
  fi_msg_tagged msg{};
  msg.addr = FI_ADDR_UNSPEC;
  msg.tag = wire::dataTag(recvId_, front.seq, 0) & ~wire::kSizeMask;
  msg.ignore = wire::kSizeMask;
  msg.context = &peek_->context;
  ssize_t rc = fi_trecvmsg(rail_.endpoint(), &msg, FI_PEEK);
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
    return remoteError(peer_, ": receive of message #", op.seq, " (", op.bytes, " bytes) failed: ", op.errorText);
  if (!op.gotDataValid)
    return internalError(peer_, ": message #", op.seq, " arrived without its tag (no immediate data)");
  bool truncated = op.error == FI_ETRUNC;
  // On FI_ETRUNC providers differ: len is what landed (then + olen is what was
  // sent) or what was sent (rxm's rendezvous).
  uint64_t sentBytes = truncated && op.gotBytes <= op.bytes ? op.gotBytes + op.overflow : op.gotBytes;
  if (op.gotData == op.tag && sentBytes == op.bytes && !truncated) return Status::ok();
  std::string sent = truncated && op.overflow == 0 ? str("more than ", op.bytes) : str(sentBytes);
  return invalidUsage(peer_, ": message mismatch at message #", op.seq, ": the posted receive expects ",
                      describeTag(op.tag), ", ", op.bytes, " bytes; the peer sent ", describeTag(op.gotData), ", ",
                      sent, " bytes");
}

}  // namespace shoal::ofi
