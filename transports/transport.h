// Transport and Connection: how bytes move between two ranks (docs/design.md, Transports).
//
// Role: a Transport exists once per kind per process (transports/registry.cc)
// and makes Connections; a Connection is one non-blocking, ordered pipe to one
// peer on one channel, in both directions. Connections are owned by a
// Communicator and used only by the engine, from whichever thread currently
// pumps it (never two threads at once), so they need no locks on the data path.
// Transports themselves may be called from several threads (one per
// communicator being set up) and lock their own shared state.
//
// Matching: messages on a Connection are matched in order, per direction. Every
// message carries a 64-bit tag (core/tag.h) and its byte count; the receiver
// checks both against the receive posted at that position and fails the
// connection with kInvalidUsage on a mismatch (ranks called different
// collectives). See docs/decisions/0001-ordered-lanes.md.
//
// Liveness: poll() reports a broken connection (EOF, reset, peer gone) as an
// error whose message names the peer (peerDescription()). The no-progress
// deadline is the engine's; poll() says whether any byte moved.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/peer_info.h"
#include "core/status.h"
#include "core/types.h"

namespace shoal {

// A finished send or receive; token is the engine's identifier of the step.
struct Completion {
  uint64_t token = 0;
  uint64_t bytes = 0;
};

// A receive whose bytes are not stored as they arrive but combined:
// dst = reduce(received, other) or reduce(other, received), in that operand
// order, with reduce::combine's meaning of op, dtype and scalar. The engine
// asks for it where a plan receives into scratch only to reduce it once
// (docs/decisions/0015); dst and other stay valid until the completion.
struct ReduceOnReceive {
  uint8_t* dst = nullptr;
  const uint8_t* other = nullptr;
  bool receivedFirst = false;
  ReduceOp op = ReduceOp::kSum;
  DataType dtype = DataType::kFloat32;
  const void* scalar = nullptr;
};

// A connection whose messages CUDA streams move by themselves (stream
// plans, docs/cuda.md): on the stream, each chunk waits for its slot with a
// stream memory operation, is copied by the GPU and published with another,
// and no host thread takes part. Messages are matched in the order they are
// enqueued, per direction, in a ring apart from postSend/postRecv's (a
// stream message never meets a posted one). Both sides of a connection
// have one or neither. Thread: enqueue*() on the thread that uses the
// communicator; progress() and release() from any thread.
class StreamLink {
 public:
  // Enqueues one message on `stream` (a CUstream on the connection's GPU):
  // src (dst) is memory that GPU reaches (device, managed or pinned host),
  // unchanged (untouched) until the stream has passed the message. Both
  // sides enqueue the same byte count (a mismatch stalls the streams until
  // the no-progress deadline). Zero bytes enqueue nothing, except where
  // zero-byte messages are barriers (window boards, comm/window_board.h).
  // `tag` (core/tag.h) goes with the message: the receiving side compares
  // it, and the byte count, with what it expected (verify()).
  virtual Status enqueueSend(const void* src, uint64_t bytes, uint64_t tag, void* stream) = 0;
  virtual Status enqueueRecv(void* dst, uint64_t bytes, uint64_t tag, void* stream) = 0;
  // Chunks enqueued and chunks the streams have passed, per direction.
  struct Progress {
    uint64_t sendEnqueued = 0, sent = 0;    // sent: chunks the peer has copied out
    uint64_t recvEnqueued = 0, received = 0;  // received: chunks the peer has published
    // Whether a send behind waits for the peer (a ring slot it must free);
    // false where a send never waits and is behind only a wait of this
    // side's, which the receive side names (window boards).
    bool sendWaitsForPeer = true;
  };
  virtual Progress progress() const = 0;
  // Compares the tag and byte count of each message the streams have
  // received since the last call with what its receive expected: a
  // mismatch (ranks called different operations or counts) is
  // kInvalidUsage naming both. Called by one thread at a time.
  virtual Status verify() = 0;
  // Every wait enqueued so far passes from now on, whatever the peer does:
  // the link is broken for good (its communicator has failed).
  virtual void release() = 0;
  // The peer, for messages ("rank 2 (host, pid 77)").
  virtual const std::string& peerDescription() const = 0;

 protected:
  ~StreamLink() = default;
};

class Connection {
 public:
  virtual ~Connection() = default;

  // Queues a message. `data` stays valid and unchanged until its completion.
  // Posting never blocks; it may return kAgain under back-pressure.
  virtual Status postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) = 0;
  // Like postSend, but a send that has finished already (its bytes are in
  // the transport's memory) sets `finished`, and poll() will not report it:
  // the engine completes it at once. Default: never finished at post.
  virtual Status postSendOrFinish(const void* data, uint64_t bytes, uint64_t tag, uint64_t token,
                                  bool& finished) {
    finished = false;
    return postSend(data, bytes, tag, token);
  }
  // Queues a receive of exactly `bytes` into `data`, matched to the next
  // incoming message in order.
  virtual Status postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) = 0;
  // Whether postRecvReduce takes a receive of `bytes` now: where the
  // transport's own copy out of its memory can be the reduction (shm frames).
  virtual bool reducesOnReceive(uint64_t /*bytes*/) const { return false; }
  // Like postRecv, matched in the same order, but the bytes are combined
  // into r.dst (see ReduceOnReceive). Only after reducesOnReceive(bytes).
  virtual Status postRecvReduce(const ReduceOnReceive& /*r*/, uint64_t /*bytes*/, uint64_t /*tag*/,
                                uint64_t /*token*/) {
    return internalError("this transport does not reduce on receive");
  }
  // Moves bytes without blocking; appends finished operations to `done` and
  // sets `progressed` when any byte moved. An error fails the connection for good.
  virtual Status poll(std::vector<Completion>& done, bool& progressed) = 0;
  // Operations posted and not yet complete.
  virtual size_t pending() const = 0;
  // A look far cheaper than poll(): false only when poll() would find
  // nothing to do right now (nothing to write, nothing arrived). A waiting
  // engine repeats it between polls, so a message is noticed within a few
  // instructions of landing. Transports without such a look keep true.
  virtual bool mightProgress() const { return true; }
  // The idle liveness check (SHOAL_IDLE_CHECK_MS): whether the peer is still
  // there, asked between operations, when nothing is posted (pending() == 0),
  // by the thread that holds the connection then (the progress thread, never
  // at the same time as the engine). Cheap and never blocking: a look at what
  // the transport already has (tcp: EOF, errors and how long since the peer's
  // host last answered; shm: the peer's process and its `closed` flag). An
  // error names the peer and fails the connection for good (loopback: a
  // peer that closed its end while this one still waits for it; ofi, whose
  // provider may say nothing of a peer that is gone, only reads what came,
  // for peerClosed). Default: alive.
  virtual Status checkAlive() { return Status::ok(); }
  // Whether the peer has closed its side in order (its bye came: it
  // destroyed, aborted or failed its communicator), asked by the thread
  // that holds the connection when nothing is posted. For the connections
  // that do not notice their peer's exit (noticesPeerExit): a peer found
  // only by a probe of its process to have exited closed first, and an
  // operation that needs it fails naming it. Default: false (not known).
  virtual bool peerClosed() { return false; }
  // The job whose operations are posted here ended without them (failed,
  // aborted, retired): whatever still touches their buffers stops before
  // this returns, and the connection is failed for good, so that no later
  // job's poll moves their bytes. cuda_ipc also waits for the GPU copies it
  // has issued. Default: nothing (test doubles).
  virtual void quiesce() {}
  // What a connection failed by quiesce() says to its later calls.
  static Status quiescedError(const std::string& peer) {
    return error(Code::kAborted, peer, ": an operation on this connection ended without its messages (it failed "
                 "or was aborted); the connection is no longer used");
  }
  // The connection's stream link (stream plans), or null: transports whose
  // bytes a host thread moves.
  virtual StreamLink* streamLink() { return nullptr; }
  // "rank 3 (host b, tcp 10.0.0.2:4431)", for error messages.
  virtual const std::string& peerDescription() const = 0;
  // Where the transport can tell the peer why this rank is failing (shm: the
  // segment, which survives the network; tcp: the bye it sends as it
  // closes), publishFailure() says it; peerFailure() is what the peer said
  // ("" if nothing). A later report that extends the first (the same text
  // and more) replaces it; any other is ignored.
  // Lets a rank whose store is unreachable (the rank that served it died)
  // still learn its neighbour's cause, and so the first cause along a chain.
  virtual bool carriesFailureReports() const { return false; }
  // Whether a report the peer publishes later reaches peerFailure() with no
  // operation of this side reading it (shm), so that a failing rank may wait
  // a moment for its peer's.
  virtual bool failureReportsArriveUnread() const { return carriesFailureReports(); }
  // `final`: nothing will be added. A failing rank first publishes a draft,
  // its own view, so that ranks failing at the same moment can read it,
  // then the final report with what the peers it waited on had reported: a
  // reader that meets a draft waits a moment for the final one, which names
  // the first cause.
  virtual void publishFailure(std::string_view /*reason*/, bool /*final*/) {}
  virtual std::string peerFailure() const { return {}; }
  // Whether the peer's report is final. Read before peerFailure(): the text
  // read after a true answer is the final report.
  virtual bool peerFailureFinal() const { return true; }
};

// Identifies one connection of one communicator (the same on both sides).
struct ConnectionKey {
  uint64_t commId = 0;  // unique per communicator, equal on all its ranks
  int selfRank = -1;
  int peerRank = -1;
  uint16_t channel = 0;
};

struct ConnectOptions {
  const PeerInfo* self = nullptr;
  const PeerInfo* peer = nullptr;
  std::string secret;   // shared by the communicator's ranks; authenticates peers
  // How long connect() may wait for the peer.
  Deadline deadline = Deadline::never();
  // Whether the connection may carry a stream link (Connection::streamLink,
  // stream plans), as every rank of the communicator agreed at init: false,
  // none of its connections does, whatever the GPU could.
  bool streamLinks = true;
  // For a connection whose peer attaches later, inside an operation (shm):
  // how long that may take. Meanwhile the operation's own no-progress
  // deadline, which knows when it waits for a stream rather than a peer,
  // judges the wait.
  Deadline attachDeadline = Deadline::never();
};

// A transport describes what it can do through the members below; the layers
// above decide by them, never by name(), so a new transport is a folder in
// transports/ and a line in registry.cc.
class Transport {
 public:
  virtual ~Transport() = default;

  // For messages, logs and SHOAL_TRANSPORT; never a decision.
  virtual std::string_view name() const = 0;
  // The class of link its connections are (the tuner's link costs).
  virtual LinkClass linkClass() const = 0;
  // Whether a rank connected to `peer` through this transport can also read
  // the peer's memory directly (the peer-reading algorithms need it).
  virtual bool readsPeerMemory(const PeerInfo& /*peer*/) const { return false; }
  // Whether its connections send from and receive into device (CUDA)
  // memory themselves, so that device buffers need not be staged through
  // host memory before they reach a connection (docs/cuda.md): cuda_ipc
  // (GPU copies through a FIFO in GPU memory), loopback in a process that
  // uses CUDA (one GPU copy, buffer to buffer). Device plans hand device
  // buffers only to connections of transports that say so, and a
  // device-direct communicator (registry.h) prefers them.
  virtual bool movesDeviceMemory() const { return false; }
  // Whether each message passes through a messaging layer emulated over
  // kernel sockets (libfabric's reliable datagrams over tcp), which the
  // tuner's model charges per message (tuner/cost_model.h).
  virtual bool emulatesMessagesOverSockets() const { return false; }
  // Memory [base, base + bytes) is being freed or deregistered: drop any
  // registration or cached key of it (a later buffer may reuse the address).
  virtual void forgetMemory(void* /*base*/, size_t /*bytes*/) {}
  // Rank `rank` of communicator `commId` in this process is gone: drop what
  // the transport holds for its connections not made yet (cuda_ipc: hellos
  // its peers sent, with their FIFOs' descriptors).
  virtual void forgetRank(uint64_t /*commId*/, int /*rank*/) {}
  // In a forked child, which gets transports of its own (registry.cc), on the
  // copy the child inherited: closes what would take the parent's traffic
  // there (a listener: peers of the parent would reach the child, and a
  // probe would find the parent alive after it exited). Nothing else of the
  // copy is used in the child; no lock is taken (only the forking thread
  // runs there).
  virtual void closeInForkedChild() {}
  // Whether this process should start it (localAddress) at all: a transport
  // whose start is costly may wait to be asked for by the environment (or by
  // a communicator's ncclConfig_t.netName, registry.h).
  virtual bool wantedInThisProcess() const { return true; }
  // Whether the registry picks it for a peer it can reach without being
  // forced (SHOAL_TRANSPORT, NCCL_NET, ncclConfig_t.netName) on a
  // communicator that is not device-direct; `self` is this rank's published
  // info.
  virtual bool chosenByDefault(const PeerInfo& /*self*/) const { return true; }
  // Prepares the transport in this process (e.g. opens the listener) and returns
  // the address peers need (empty for in-process transports). Idempotent.
  virtual Result<std::string> localAddress() = 0;
  // Whether this transport can connect self to peer.
  virtual bool canConnect(const PeerInfo& self, const PeerInfo& peer) const = 0;
  // Whether the peer's process is there, found from `self` without a
  // connection through the address the peer published for this transport
  // (tcp: its listener, which lives as long as its process; never a
  // loopback address of a peer on another kernel): kGone with why, kAlive
  // where something there took the probe, kUnknown where the transport
  // cannot tell or the probe proved nothing. Bounded by the deadline. Asked
  // while a connect waits for the peer, and of peers whose connections do
  // not notice an exit (noticesPeerExit) while an operation waits on them
  // (ConnectionTable).
  struct ProcessProbe {
    enum State : uint8_t { kUnknown, kAlive, kGone } state = kUnknown;
    std::string why;  // kGone: "its process has exited (...)"
  };
  virtual ProcessProbe probePeerProcess(const PeerInfo& /*self*/, const PeerInfo& /*peer*/,
                                        Deadline /*deadline*/) const {
    return {};
  }
  // Housekeeping, from the idle check's thread once per interval (never at
  // the same time as itself): tcp accepts what waits on its listener while
  // no connect does (other processes' probes, which would otherwise fill
  // its backlog). Never blocks for long.
  virtual void tidy() {}
  // Whether this transport's connections find by themselves that the peer's
  // process exited: tcp reads the end of its streams, shm and cuda_ipc look
  // at the peer's process, loopback's peer is this process. ofi's do not: a
  // provider may report nothing for a peer that is gone (a receive from it
  // just never completes), so the connection table asks another transport's
  // probe (probePeerProcess) instead.
  virtual bool noticesPeerExit() const { return true; }
  // Establishes the connection `key`; both ranks call it with mirrored keys.
  // May block until the peer's side arrives or the deadline passes, but must not
  // need the peer to be inside connect() at the same moment when it is a
  // transport that one thread uses for several ranks (loopback never blocks).
  virtual Result<std::unique_ptr<Connection>> connect(const ConnectionKey& key,
                                                      const ConnectOptions& options) = 0;
  // Whether connect(key) may wait for the peer's side (tcp and ofi: the
  // higher rank waits for the lower's hello; the lower never waits). One
  // thread that drives several ranks in a group connects every side that does
  // not wait first (Communicator::connectAhead), so no side waits for a peer
  // that the same thread would only reach later.
  virtual bool connectWaitsForPeer(const ConnectionKey& /*key*/) const { return false; }
  // Whether this process's CPU moves every byte through kernel sockets (tcp;
  // ofi over a socket provider): bytes still in its cache then leave faster,
  // which the tuner's model counts (docs/decisions/0006, 0007). Known once
  // localAddress() has succeeded.
  virtual bool cpuCopiesBytes() const { return false; }
};

}  // namespace shoal
