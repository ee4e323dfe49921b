// TcpStore: the client side of the TCP store (see store_protocol.h).
//
// Owner: shared_ptr handed out by connectStore(). Thread: any number of
// threads may call it at once. Requests are pipelined on one connection and
// paired with replies by id, so a GET that waits for a key another thread of
// this process will SET does not block that SET. One waiting thread at a time
// reads from the socket ("reader") and hands replies to the others.
// Lock order: mutex_ only; the reader reads without it and takes it to deliver.
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <condition_variable>
#include <map>
#include <mutex>

#include "bootstrap/bootstrap.h"
#include "bootstrap/store_protocol.h"
#include "core/log.h"
#include "core/params.h"
#include "net/crypto.h"
#include "net/socket.h"

namespace shoal {

using namespace bootstrap_wire;

namespace {

constexpr int64_t kReaderSliceNs = 100 * 1000000;  // a reader re-checks its own reply this often

struct Reply {
  bool done = false;
  uint8_t status = 0;
  std::vector<uint8_t> body;
};

class TcpStore final : public Store {
 public:
  TcpStore(net::Fd fd, std::string rootAddress) : fd_(std::move(fd)), root_(std::move(rootAddress)) {}

  Status set(const std::string& key, std::string_view value, Deadline deadline) override;
  Result<std::vector<std::string>> get(const std::vector<std::string>& keys, Deadline deadline) override;
  Status erase(const std::vector<std::string>& keys, Deadline deadline) override;
  Result<std::vector<bool>> check(const std::vector<std::string>& keys, Deadline deadline) override;
  Status setWill(const std::string& key, std::string_view value, Deadline deadline) override;
  Status cancelWill(const std::string& key, Deadline deadline) override;
  std::string describe() const override { return "tcp " + root_; }

 private:
  // Sends one request and waits for its reply.
  Result<Reply> request(uint8_t command, const std::vector<uint8_t>& body, Deadline deadline,
                        std::string_view what);
  // Reads whatever arrives within the slice and delivers complete replies.
  // Called without mutex_ by the one reader.
  void readSlice(Deadline until);
  void fail(Status status);  // marks the connection broken (mutex_ held)
  // "bootstrap root <addr> closed the connection" for EOF and resets.
  Status rootGone(const net::IoResult& io) const {
    if (io.closed) return remoteError("bootstrap root ", root_, " closed the connection");
    if (io.error == ECONNRESET || io.error == EPIPE)
      return remoteError("bootstrap root ", root_, " closed the connection (", std::strerror(io.error), ")");
    return net::ioStatus(io, str("bootstrap root ", root_));
  }

  const net::Fd fd_;
  const std::string root_;

  std::mutex mutex_;
  std::condition_variable delivered_;
  std::map<uint64_t, Reply*> waiting_;  // request id -> where its reply goes
  uint64_t nextRequestId_ = 1;
  bool reading_ = false;
  // One request is written at a time, without mutex_: a writer the root
  // does not read from (a full socket) holds up neither the reader nor the
  // other callers past their own deadlines.
  bool writing_ = false;
  Status broken_;
  std::vector<uint8_t> in_;  // owned by the current reader
};

void TcpStore::fail(Status status) {
  if (broken_.isOk()) broken_ = std::move(status);
  delivered_.notify_all();
}

Result<Reply> TcpStore::request(uint8_t command, const std::vector<uint8_t>& body, Deadline deadline,
                                std::string_view what) {
  Reply reply;
  std::unique_lock<std::mutex> lock(mutex_);
  if (!broken_.isOk()) return Status(broken_).withContext(what);
  uint64_t id = nextRequestId_++;
  std::vector<uint8_t> frame;
  frame.reserve(body.size() + 13);
  Writer w(frame);
  size_t at = beginFrame(w, id, command);
  w.bytes(body.data(), body.size());
  finishFrame(w, at);
  while (writing_) {
    if (!broken_.isOk()) return Status(broken_).withContext(what);
    if (deadline.expired())
      return error(deadline.cancelled() ? Code::kAborted : Code::kTimeout, what,
                   ": another request to bootstrap root ", root_, " was still being sent at the deadline");
    const int64_t waitNs = std::min<int64_t>(deadline.remainingMs() + 1, kReaderSliceNs / 1000000) * 1000000;
    delivered_.wait_for(lock, std::chrono::nanoseconds(waitNs));
  }
  if (!broken_.isOk()) return Status(broken_).withContext(what);
  writing_ = true;
  waiting_[id] = &reply;  // before the bytes go: the reader may deliver the reply at once
  lock.unlock();
  Status sent = net::writeExact(fd_.get(), frame.data(), frame.size(), deadline, str("bootstrap root ", root_));
  lock.lock();
  writing_ = false;
  delivered_.notify_all();  // the next writer
  if (!sent.isOk()) {
    waiting_.erase(id);
    if (sent.code() == Code::kRemoteError)
      sent = remoteError("bootstrap root ", root_, " closed the connection (", sent.message(), ")");
    // A partly written frame leaves the stream unusable.
    fail(sent);
    return sent.withContext(what);
  }
  for (;;) {
    if (reply.done) break;
    if (!broken_.isOk()) {
      waiting_.erase(id);
      return Status(broken_).withContext(what);
    }
    if (deadline.expired()) {
      waiting_.erase(id);  // a late reply is dropped by the reader
      if (deadline.cancelled())
        return error(Code::kAborted, what, ": cancelled while waiting for bootstrap root ", root_);
      return error(Code::kTimeout, what, ": no reply from bootstrap root ", root_, " before the deadline");
    }
    Deadline slice = Deadline::afterMs(std::min<int64_t>(deadline.remainingMs() + 1, kReaderSliceNs / 1000000));
    if (!reading_) {
      reading_ = true;
      lock.unlock();
      readSlice(slice);
      lock.lock();
      reading_ = false;
      delivered_.notify_all();  // someone else may take over reading
    } else {
      delivered_.wait_until(lock, Clock::time_point(std::chrono::nanoseconds(slice.atNs())));
    }
  }
  return reply;
}

void TcpStore::readSlice(Deadline until) {
  Result<bool> ready = net::waitReadable(fd_.get(), until);
  if (!ready.isOk()) {
    std::lock_guard<std::mutex> lock(mutex_);
    return fail(ready.takeStatus());
  }
  if (!ready.value()) return;
  uint8_t chunk[64 << 10];
  for (;;) {
    net::IoResult io = net::readSome(fd_.get(), chunk, sizeof(chunk));
    if (io.closed) {
      std::lock_guard<std::mutex> lock(mutex_);
      return fail(rootGone(io));
    }
    if (!io.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      return fail(rootGone(io));
    }
    in_.insert(in_.end(), chunk, chunk + io.bytes);
    if (io.bytes < sizeof(chunk)) break;
  }
  size_t start = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  while (in_.size() - start >= 4) {
    Reader lenReader(in_.data() + start, 4);
    uint32_t len = lenReader.u32();
    if (len > kMaxFrameBytes || len < 9)
      return fail(remoteError("bootstrap root ", root_, " sent a malformed frame (length ", len, ")"));
    if (in_.size() - start < 4 + static_cast<size_t>(len)) break;
    Reader r(in_.data() + start + 4, len);
    uint64_t id = r.u64();
    uint8_t status = r.u8();
    if (auto it = waiting_.find(id); it != waiting_.end()) {
      Reply* reply = it->second;
      reply->status = status;
      reply->body.assign(in_.begin() + static_cast<ptrdiff_t>(start + 13),
                         in_.begin() + static_cast<ptrdiff_t>(start + 4 + len));
      reply->done = true;
      waiting_.erase(it);
    }
    start += 4 + len;
  }
  in_.erase(in_.begin(), in_.begin() + static_cast<ptrdiff_t>(start));
  // The connection lives as long as its communicator: one large reply must
  // not pin its buffer for that long.
  if (in_.empty() && in_.capacity() > (8u << 20)) in_.shrink_to_fit();
  delivered_.notify_all();
}

// Turns a non-ok reply status into a Status.
Status replyStatus(const Reply& reply, std::string_view what) {
  if (reply.status == kOk) return Status::ok();
  Reader r(reply.body.data(), reply.body.size());
  if (reply.status == kBadRequest) return internalError(what, ": the bootstrap root refused the request: ", r.str());
  return internalError(what, ": unexpected reply status ", static_cast<int>(reply.status));
}

void putKeys(Writer& w, const std::vector<std::string>& keys) {
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
}

Status checkKeySize(const std::string& key) {
  if (key.size() > kMaxKeyBytes) return invalidArgument("store key longer than ", kMaxKeyBytes, " bytes");
  return Status::ok();
}

// {str key, str value}, for kSet and kWill.
Result<std::vector<uint8_t>> keyAndValue(const std::string& key, std::string_view value) {
  SHOAL_TRY(checkKeySize(key));
  if (value.size() + key.size() + 32 > kMaxFrameBytes)
    return invalidArgument("store value of ", value.size(), " bytes exceeds the 64 MiB frame limit");
  std::vector<uint8_t> body;
  Writer w(body);
  w.str(key);
  w.str(value);
  return body;
}

Status TcpStore::set(const std::string& key, std::string_view value, Deadline deadline) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<uint8_t> body, keyAndValue(key, value));
  std::string what = str("store set '", key, "'");
  SHOAL_ASSIGN_OR_RETURN(Reply reply, request(kSet, body, deadline, what));
  return replyStatus(reply, what);
}

Status TcpStore::setWill(const std::string& key, std::string_view value, Deadline deadline) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<uint8_t> body, keyAndValue(key, value));
  std::string what = str("store will for '", key, "'");
  SHOAL_ASSIGN_OR_RETURN(Reply reply, request(kWill, body, deadline, what));
  return replyStatus(reply, what);
}

Status TcpStore::cancelWill(const std::string& key, Deadline deadline) {
  SHOAL_TRY(checkKeySize(key));
  std::vector<uint8_t> body;
  Writer w(body);
  w.str(key);
  std::string what = str("store cancel of the will for '", key, "'");
  SHOAL_ASSIGN_OR_RETURN(Reply reply, request(kCancelWill, body, deadline, what));
  return replyStatus(reply, what);
}

Result<std::vector<std::string>> TcpStore::get(const std::vector<std::string>& keys, Deadline deadline) {
  for (const auto& k : keys) SHOAL_TRY(checkKeySize(k));
  std::vector<uint8_t> body;
  Writer w(body);
  // The root gives up a little after us, so that our own deadline decides.
  bool never = deadline.atNs() == Deadline::never().atNs();
  int64_t timeoutMs = never ? -1 : deadline.remainingMs() + 1000;
  w.u32(never || timeoutMs >= int64_t(kNoTimeout) ? kNoTimeout : static_cast<uint32_t>(timeoutMs));
  putKeys(w, keys);
  std::string what = str("store get of ", keys.size(), keys.size() == 1 ? " key" : " keys");
  Result<Reply> answered = request(kGet, body, deadline, what);
  if (!answered.isOk()) {
    if (answered.status().code() != Code::kTimeout) return answered.takeStatus();
    std::string some;
    for (size_t i = 0; i < keys.size() && i < 4; ++i) some += (i ? ", " : "") + keys[i];
    return error(Code::kTimeout, what, ": timed out waiting for the keys (", some, keys.size() > 4 ? ", ..." : "",
                 ") at bootstrap root ", root_, " (", answered.status().message(), ")");
  }
  Reply reply = std::move(answered.value());
  Reader r(reply.body.data(), reply.body.size());
  if (reply.status == kTimeout) {
    uint32_t n = r.count(4);
    std::string missing;
    for (uint32_t i = 0; i < n && r.ok(); ++i) missing += (i ? ", " : "") + r.str(kMaxKeyBytes);
    return error(Code::kTimeout, what, ": timed out; missing: ", missing);
  }
  SHOAL_TRY(replyStatus(reply, what));
  uint32_t n = r.count(4);
  std::vector<std::string> values;
  values.reserve(n);
  for (uint32_t i = 0; i < n && r.ok(); ++i) values.push_back(r.str());
  if (!r.ok() || n != keys.size())
    return remoteError(what, ": malformed reply from bootstrap root ", root_);
  return values;
}

Status TcpStore::erase(const std::vector<std::string>& keys, Deadline deadline) {
  for (const auto& k : keys) SHOAL_TRY(checkKeySize(k));
  std::vector<uint8_t> body;
  Writer w(body);
  putKeys(w, keys);
  std::string what = "store erase";
  SHOAL_ASSIGN_OR_RETURN(Reply reply, request(kErase, body, deadline, what));
  return replyStatus(reply, what);
}

Result<std::vector<bool>> TcpStore::check(const std::vector<std::string>& keys, Deadline deadline) {
  for (const auto& k : keys) SHOAL_TRY(checkKeySize(k));
  std::vector<uint8_t> body;
  Writer w(body);
  putKeys(w, keys);
  std::string what = "store check";
  SHOAL_ASSIGN_OR_RETURN(Reply reply, request(kCheck, body, deadline, what));
  SHOAL_TRY(replyStatus(reply, what));
  Reader r(reply.body.data(), reply.body.size());
  uint32_t n = r.count(1);
  std::vector<bool> exists;
  for (uint32_t i = 0; i < n && r.ok(); ++i) exists.push_back(r.u8() != 0);
  if (!r.ok() || n != keys.size()) return remoteError(what, ": malformed reply from bootstrap root ", root_);
  return exists;
}

// Client half of the handshake (store_protocol.h).
Status clientHandshake(int fd, const UniqueIdContents& id, const std::string& root, Deadline deadline) {
  std::string key = deriveKey(id.secret, id.magic);
  uint8_t nonceC[kNonceBytes];
  SHOAL_TRY(net::randomBytes(nonceC, sizeof(nonceC)));
  std::vector<uint8_t> hello;
  Writer w(hello);
  w.u32(kHandshakeTag);
  w.u16(kVersion);
  w.u16(0);
  w.u64(id.magic);
  w.bytes(nonceC, sizeof(nonceC));
  std::string what = str("bootstrap root ", root);
  if (Status s = net::writeExact(fd, hello.data(), hello.size(), deadline, what); !s.isOk())
    return s.withContext("handshake");
  uint8_t challenge[kChallengeBytes];
  if (Status s = net::readExact(fd, challenge, sizeof(challenge), deadline, what); !s.isOk()) {
    if (s.code() == Code::kRemoteError)
      return remoteError("bootstrap root ", root,
                         " closed the connection during the handshake (it does not serve this "
                         "ncclUniqueId: a stale id, another job's root, or every rank that had "
                         "connected with it has died or failed, and the root forgets such an id "
                         "SHOAL_INIT_TIMEOUT_MS after the last one, or at once if they left no word: "
                         "look for the first rank's error)");
    return s.withContext("handshake");
  }
  Reader r(challenge, sizeof(challenge));
  uint32_t tag = r.u32();
  uint16_t version = r.u16();
  r.u16();
  uint8_t nonceS[kNonceBytes];
  r.bytes(nonceS, sizeof(nonceS));
  uint8_t mac[32];
  r.bytes(mac, sizeof(mac));
  net::Digest expected = serverMac(key, nonceC, nonceS);
  if (tag != kHandshakeTag || version != kVersion || !net::constantTimeEqual(mac, expected.data(), 32))
    return remoteError("bootstrap root ", root,
                       " failed to prove it holds the ncclUniqueId's secret (a different id, or another service "
                       "on that port)");
  net::Digest proof = clientMac(key, nonceS, nonceC);
  if (Status s = net::writeExact(fd, proof.data(), proof.size(), deadline, what); !s.isOk())
    return s.withContext("handshake");
  uint8_t accept[kAcceptBytes];
  if (Status s = net::readExact(fd, accept, sizeof(accept), deadline, what); !s.isOk()) {
    if (s.code() == Code::kRemoteError)
      return remoteError("bootstrap root ", root, " rejected our proof of the ncclUniqueId's secret");
    return s.withContext("handshake");
  }
  Reader a(accept, sizeof(accept));
  if (a.u32() != kAcceptTag) return remoteError("bootstrap root ", root, " sent a malformed handshake reply");
  return Status::ok();
}

}  // namespace

Result<std::vector<bool>> Store::check(const std::vector<std::string>&, Deadline) {
  return error(Code::kUnsupported, describe(), " cannot list which keys exist");
}

Result<std::optional<Store::Found>> Store::firstPresent(const std::vector<std::string>& keys, Deadline deadline) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<bool> present, check(keys, deadline));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!present[i]) continue;
    SHOAL_ASSIGN_OR_RETURN(std::vector<std::string> value, get({keys[i]}, deadline));
    return std::optional<Found>(Found{i, std::move(value[0])});
  }
  return std::optional<Found>();
}

Result<std::shared_ptr<Store>> connectStore(const UniqueIdContents& id, Deadline deadline) {
  SHOAL_ASSIGN_OR_RETURN(net::SocketAddress address, net::SocketAddress::resolve(id.address));
  std::string root = address.toString();
  Result<net::Fd> connected = net::connectWithRetry(address, deadline);
  if (!connected.isOk()) return connected.takeStatus().withContext("bootstrap: connecting to the root");
  net::Fd fd = std::move(connected.value());
  SHOAL_TRY(net::setNoDelay(fd.get()));
  SHOAL_TRY(net::setLiveness(fd.get(), net::LivenessOptions::fromParams()));
  const int64_t handshakeMs = handshakeTimeoutMs();
  Deadline handshakeDeadline = deadline.cappedMs(handshakeMs);
  if (Status s = clientHandshake(fd.get(), id, root, handshakeDeadline); !s.isOk())
    return s.withContext("bootstrap");
  SHOAL_INFO(subsys::kBootstrap, "connected to bootstrap root ", root);
  return std::shared_ptr<Store>(std::make_shared<TcpStore>(std::move(fd), root));
}

}  // namespace shoal
