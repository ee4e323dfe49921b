// OfiConnection: one ordered, tag-checked pipe to one peer over a libfabric
// RDM endpoint that it shares with every other connection on its rail.
//
// Role: the data path of the ofi transport (README.md has the wire format).
// Owner: the Communicator that asked OfiTransport::connect for it; the Rail it
// posts on belongs to the transport and outlives it.
// Thread: used only by the engine, by whichever thread pumps it, one at a time
// (transport.h); every libfabric call is made under the rail's mutex, because
// other connections on the rail (other communicators, polled by another
// engine thread) and connect() share the endpoint.
//
// Matching: message n of B bytes in one direction travels with libfabric tag
// dataTag(receiver's connection id, n, B) and Shoal's tag as immediate data;
// the receiver posts its n-th receive with exactly that libfabric tag. So the
// provider matches by position whatever order receives are posted in, keeps
// messages that arrive before their receive (its unexpected queue; large ones
// wait at the sender for rendezvous), and the receiver then checks Shoal's tag
// (immediate data) and the byte count before it reports the receive. A
// message of another size cannot match (the tag's size bits differ); a
// receive that waits peeks (FI_PEEK, size bits ignored) every 50 ms for such
// a message. Either mismatch fails the connection with kInvalidUsage naming
// the peer, both tags and both sizes. Where the provider cannot peek (1.17's
// shm takes a peek for a receive), a size mismatch waits for the engine's
// no-progress deadline, which names the peer.
// Completions are reported in posting order per direction.
//
// Closing: the destructor cancels its posted receives (their Ops become the
// rail's orphans until the provider is done with them) and sends the peer a
// bye; a peer that receives a bye while it still waits for operations fails
// with kRemoteError ("closed by the peer").
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "transports/ofi/ofi_fabric.h"
#include "transports/transport.h"

namespace shoal::ofi {

class OfiConnection final : public Connection {
 public:
  // `recvId` was allocated on `rail` (its bye receive is posted here);
  // setPeer() completes it once the peer's hello has named its id.
  OfiConnection(Rail& rail, fi_addr_t peer, uint32_t recvId, uint64_t injectLimit, std::string peerDescription);
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
  size_t pending() const override { return sends_.size() + recvs_.size(); }
  const std::string& peerDescription() const override { return peer_; }

  int railIndex() const { return rail_.index(); }

 private:
  Op* newOp();
  void recycle(Op* op);
  // Hands queued operations to the provider in order until it pushes back
  // (rail mutex held).
  Status issue(std::deque<Op*>& ops, size_t& unposted);
  Status issueOne(Op& op);
  Status finishRecv(const Op& op) const;
  // A receive that waits may have a message of another size in its place
  // (its tag differs in the size bits, so it cannot match): look with FI_PEEK.
  Status peekForMismatch();
  Status fail(Status status);

  Rail& rail_;
  const fi_addr_t peerAddress_;
  const uint32_t recvId_;
  uint32_t peerRecvId_ = 0;  // 0 until the peer's hello is claimed
  PeerHello expected_;
  const uint64_t injectLimit_;
  const std::string peer_;
  std::deque<Op*> sends_;  // posting order; the first `unposted` from the back wait for the provider
  std::deque<Op*> recvs_;
  size_t unpostedSends_ = 0;
  size_t unpostedRecvs_ = 0;
  uint64_t nextSendSeq_ = 0;
  uint64_t nextRecvSeq_ = 0;
  std::vector<Op*> spare_;
  Op* bye_ = nullptr;
  Op* peek_ = nullptr;
  bool peekable_;
  int64_t nextPeekNs_ = 0;
  Status failure_;
};

}  // namespace shoal::ofi
