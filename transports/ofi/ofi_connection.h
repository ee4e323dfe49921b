// OfiConnection: one ordered, tag-checked pipe to one peer over one or more
// libfabric RDM endpoints ("lanes") of its rail, which it shares with every
// other connection on the rail.
//
// Role: the data path of the ofi transport (README.md has the wire format).
// Owner: the Communicator that asked OfiTransport::connect for it; the Rail it
// posts on belongs to the transport and outlives it.
// Thread: used only by the engine, by whichever thread pumps it, one at a time
// (transport.h); every libfabric call is made under the rail's mutex, because
// other connections on the rail (other communicators, polled by another
// engine thread) and connect() share the endpoint.
//
// Lanes: lane j joins endpoint j of this rail to endpoint j of the peer's
// (lanes = the fewer endpoints of the two sides); each lane numbers its own
// messages per direction. A message of at least wire::kStripeMinBytes on a
// connection of several lanes is striped: part j goes on lane (c + j) %
// lanes, c the channel's number on its rail (channel / rails), so every lane
// carries one part and a large message moves over all of the pair's
// provider connections at once (over tcp;ofi_rxm, one TCP stream each), as
// the tcp transport stripes over its sockets; smaller messages go whole on
// the channel's own lane (c % lanes), in order (wire::partLane says why they
// do not rotate). Both sides plan a message from its byte count (the
// receiver from its posted receive), so they agree on every part's lane and
// lane message number.
//
// Matching: each part of message n of B bytes travels on its lane with
// libfabric tag dataTag(receiver's connection id, its lane message number,
// B, parts) and Shoal's tag as immediate data; the receiver posts the same
// part with exactly that libfabric tag. So the
// provider matches by position whatever order receives are posted in, keeps
// messages that arrive before their receive (its unexpected queue; above
// rxm's eager limit they wait at the sender for a rendezvous), and the
// receiver then checks Shoal's tag
// (immediate data) and the byte count of every part before it reports the
// message. A message of another size cannot match (the tag's size bits
// differ); a receive that waits peeks (FI_PEEK, size bits ignored) every 50 ms
// for such a message, and learns the size the peer sent from what it sees
// (wire::sentBytes). Either mismatch fails the connection with kInvalidUsage
// naming the peer, both tags and both sizes. Where the provider cannot peek
// (1.17's shm takes a peek for a receive; it has one lane), a size mismatch
// waits for the engine's no-progress deadline, which names the peer.
// Completions are reported per message, in posting order per direction.
//
// Clear to send: where a side's provider streams large messages through a
// shared segment in order (shmSendsStream: 1.17's shm without CMA), a message
// nobody receives yet would hold up every later one between the two
// endpoints, other connections' included. Such a side says so in its hello
// (clearAbove = its inject limit) and sends no part above that size until the
// receiver has posted the part's receive: it posts a zero-byte receive on
// clearTag(its id, the part's lane number) when the message is queued, and
// the receiver sends that tag once it has posted the part's receive (after
// claiming the hello; until then it keeps the clearance). The sender's queue
// waits at a part whose clearance has not come; the receiver posts receives in
// the order the sender sends, so this cannot wait on a later message.
// rxm over kernel sockets gets it too, for parts above 128 KiB (decision
// 0011): there an early part costs a copy out of rxm's own memory, not
// progress, so a part waits at most ClearToSend::maxWaitNs at the head of the
// queue and then goes without; its clearance receive stays posted
// ("abandoned": recycled if the clearance comes after all, cancelled by the
// destructor). That bound is what lets a receive posted with another size,
// which owes no clearance, still see the message and report the mismatch.
//
// Closing: the destructor cancels its posted receives (their Ops become the
// rail's orphans until the provider is done with them) and sends the peer a
// bye on every lane; a bye arrives after everything sent before it on its lane
// (FI_ORDER_SAS), so a peer that has a bye on a lane while it still waits for
// an operation on that lane fails with kRemoteError ("closed by the peer").
// The rail also receives byes for every connection (Rail::byeArrived), so
// one that arrives after its connection closed is consumed, not left with
// the provider.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "transports/ofi/ofi_fabric.h"
#include "transports/transport.h"

namespace shoal::ofi {

// Which of a side's sends wait for the receiver's clear-to-send (see Clear
// to send above): parts larger than `above` (0: none), for at most
// `maxWaitNs` at the head of the send queue (< 0: as long as it takes).
struct ClearToSend {
  uint64_t above = 0;
  int64_t maxWaitNs = -1;
};

class OfiConnection final : public Connection {
 public:
  // `recvId` was allocated on `rail` (the rail records the peer's byes
  // under it; start() posts this connection's own bye receives);
  // `peerLanes` are the peer's endpoints in the AVs of this rail's
  // endpoints 0..lanes-1; `railChannel` is the channel's number among the
  // channels on this rail (channel / rails) and picks the lane of its whole
  // messages (railChannel % lanes), so the channels of a pair on one rail
  // use different lanes.
  // `clearToSend`: this side's sends that wait for the receiver's
  // clear-to-send (`above` is what the hello tells the peer).
  OfiConnection(Rail& rail, std::vector<fi_addr_t> peerLanes, uint16_t railChannel, uint32_t recvId,
                uint64_t injectLimit, ClearToSend clearToSend, std::string peerDescription);
  ~OfiConnection() override;

  // Who the peer is, for claiming its hello (which names the id its data
  // must be tagged with). Until it arrives, sends wait in the queue.
  struct PeerHello {
    uint64_t commId = 0;
    int peerRank = -1;
    int selfRank = -1;
    uint16_t channel = 0;
    std::string secret;
  };
  // Rail mutex held.
  Status start(PeerHello expected);
  // Claims the peer's hello if it has arrived; true once the peer is known.
  bool resolvePeer();

  Status postSend(const void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status postRecv(void* data, uint64_t bytes, uint64_t tag, uint64_t token) override;
  Status poll(std::vector<Completion>& done, bool& progressed) override;
  size_t pending() const override { return pendingMessages_; }
  // A job ended without its operations here (failed, aborted): the
  // connection fails for good, so that no later poll (another job's) moves
  // their bytes into or out of buffers their owner has been told are done.
  // (A provider that places data without being polled, such as EFA, may
  // still write into a posted receive until the connection is destroyed.)
  void quiesce() override { (void)fail(quiescedError(peer_)); }
  // The idle check: the provider says nothing of a peer that is gone, so
  // this only reads what came (rail mutex taken; lane 0 progressed, which
  // also ends the rail's drains there): a bye, which peerClosed() reads
  // after progressing lane 0 again, or an error completion of a bye
  // receive. One progress of the rail's lane 0 each.
  Status checkAlive() override;
  bool peerClosed() override;

  const std::string& peerDescription() const override { return peer_; }

  int railIndex() const { return rail_.index(); }
  int laneCount() const { return static_cast<int>(peerLanes_.size()); }
  // Sends that stopped waiting for their optional clearance, and their
  // clearances still posted (see Clear to send; tests, diagnostics).
  uint64_t clearancesGivenUp() const { return clearancesGivenUp_; }
  size_t clearancesAbandoned() const { return abandonedClearances_.size(); }

 private:
  // One direction's queue: an Op per part, in posting order; the first
  // `unposted` from the back wait for the provider.
  struct Queue {
    std::deque<Op*> ops;
    size_t unposted = 0;
    uint64_t nextSeq = 0;            // message number
    std::vector<uint64_t> laneSeqs;  // next message number on each lane
  };
  // Queues message `data`/`bytes` as its parts (see Lanes above).
  void plan(Queue& queue, Op::Kind kind, void* data, uint64_t bytes, uint64_t tag, uint64_t token);

  Op* newOp();
  void recycle(Op* op);
  // Hands queued operations to the provider in order until it pushes back
  // (rail mutex held).
  Status issue(Queue& queue);
  Status issueOne(Op& op);
  Status finishRecv(const Op& op) const;
  // Posts the clearance receives that wait for the provider (rail mutex held).
  Status postClearanceRecvs();
  // Whether the send `op` at the head of the queue stops waiting for its
  // optional clearance (clearanceMaxWaitNs_ passed); then its clearance moves to
  // abandonedClearances_ and op.clearance is null.
  bool giveUpClearance(Op& op);
  void noteLaneTraffic(uint8_t lane) {
    if ((lanesWithTraffic_ >> lane & 1u) != 0) return;
    lanesWithTraffic_ |= 1u << lane;
    rail_.noteNewLaneTraffic();
  }
  // Sends the clear-to-sends owed for posted receives once the peer's hello
  // says it wants them (rail mutex held).
  Status sendClearances();
  // A receive that waits may have a message of another size in its place
  // (its tag differs in the size bits, so it cannot match): look with FI_PEEK.
  Status peekForMismatch();
  // A bye on a lane where an operation still waits: it never will complete.
  Status checkByes();
  // A bye receive that completed with an error: the connection failed.
  Status checkByeReceives();
  Status fail(Status status);

  Rail& rail_;
  const std::vector<fi_addr_t> peerLanes_;
  const uint64_t railChannel_;  // see the constructor
  const uint32_t recvId_;
  uint32_t peerRecvId_ = 0;  // 0 until the peer's hello is claimed
  const uint64_t clearAbove_;    // ours (see Clear to send)
  uint64_t peerClearAbove_ = 0;  // the peer's, from its hello
  const int64_t clearanceMaxWaitNs_;  // ClearToSend::maxWaitNs
  // When the send at the head of the queue began waiting for its clearance
  // (0: none waits yet), and the clearances given up on, still posted.
  int64_t clearanceWaitSinceNs_ = 0;
  std::deque<Op*> abandonedClearances_;
  uint64_t clearancesGivenUp_ = 0;
  PeerHello expected_;
  const uint64_t injectLimit_;
  const std::string peer_;
  Queue sends_;
  Queue recvs_;
  size_t pendingMessages_ = 0;  // posted and not reported, both directions
  // Parts queued and not yet reported, per lane: poll() drives only the
  // endpoints that have some, and endpoint 0 until the peer's hello is
  // claimed (an idle endpoint would cost a provider call, over tcp;ofi_rxm a
  // poll(2) of its sockets, on every poll: measured +4 us on an 8-byte
  // AllReduce with 2 endpoints).
  uint32_t partsOnLane_[kMaxEndpointsPerRail] = {};
  // Lanes that have completed an operation (bit per lane): the first one on
  // a lane tells the rail (noteLaneTraffic, Rail::noteNewLaneTraffic).
  uint32_t lanesWithTraffic_ = 0;
  // Sender: clearance receives in send order, the first `clearancesUnposted_`
  // from the back not yet given to the provider. Receiver: (lane, lane
  // number) of posted receives whose clear-to-send is not yet sent.
  std::deque<Op*> clearances_;
  size_t clearancesUnposted_ = 0;
  struct OwedClearance {
    uint8_t lane;
    uint64_t laneSeq;
    uint64_t bytes;
  };
  std::deque<OwedClearance> owedClearances_;
  std::vector<Op*> spare_;
  std::vector<Op*> byes_;  // exact-tag bye receives, one per lane, posted by start()
  Op* peek_ = nullptr;
  bool peekable_;
  int64_t nextPeekNs_ = 0;
  Status failure_;
};

}  // namespace shoal::ofi
