// The messages ranks exchange while a communicator is made or split, as typed
// values with one byte form each (core/wire.h), and the pure rule that turns
// everyone's proposals into the one agreement every rank computes alike.
//
// Communicator::initialize makes two all-gathers over the bootstrap:
//   1. PeerRecord: the communicator size the rank was given and its PeerInfo.
//   2. InitProposal: what only this rank knows yet every rank's plans depend
//      on: whether it reads every peer's memory (peer-reading algorithms need
//      all ranks to), the network link the first node leader chose for the
//      second (each process knows only which of its own transports work),
//      whether it can move device buffers GPU to GPU to every peer, and its
//      machine facts. agree() pools them.
// Communicator::split all-gathers one SplitRecord per parent rank.
// Communicator::registerWindow all-gathers a WindowRecord per rank, then
// WindowFlags saying to whom each sent its allocation's descriptor, then,
// once each has mapped what it can, WindowFlags saying whose buffers each
// maps.
//
// Every message starts with a kind byte, so bytes of another kind (or of a
// peer built from another version) are refused, never misread. Decoders read
// another process's bytes and refuse anything malformed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/peer_info.h"
#include "core/status.h"
#include "topology/machine.h"

namespace shoal {

struct PeerRecord {
  int nranks = 0;  // as this rank was told at init
  PeerInfo info;
  // Random per init: names this rank's will in the store (Bootstrap::setWill),
  // and rank 0's this communicator's failure reports (Bootstrap::setGeneration),
  // apart from those of an earlier communicator with the same scope
  // (NCCL_COMM_ID gives every one the same).
  uint64_t nonce = 0;
};
std::string encodePeerRecord(const PeerRecord& record);
Result<PeerRecord> decodePeerRecord(std::string_view bytes);

// The transport the first node leader uses to reach the second, and what the
// tuner's model needs to know about it.
struct NetLink {
  std::string transport;  // Transport::name(), for the log and the model's table
  bool cpuCopiesBytes = false;
  bool emulatesMessagesOverSockets = false;
  bool operator==(const NetLink&) const = default;
};

struct InitProposal {
  bool readsEveryPeer = true;     // this rank reads every other process's memory
  // Device-direct (transports/registry.h, TransportChoice): this rank has a
  // GPU whose reduction kernels loaded and reaches every peer through a
  // transport that moves device memory.
  bool deviceDirect = false;
  // Whether its GPU's streams run stream plans (Driver::streamPlansWanted)
  // and its peers allow stream links (Communicator::whyNoStreamLinks: not
  // a mix of threads and processes, no thread of its process on its GPU
  // or on one without peer access): the connections carry stream links
  // only where every rank proposes them.
  bool streamPlans = false;
  // Whether its GPU has too few hardware queues for work on streams of the
  // library's own while the user's stream waits for it
  // (cuda::Driver::fewHardwareQueues): then no rank steps operations on
  // windows through the GPU, since every rank must run the same plan.
  bool fewHardwareQueues = false;
  // Whether its GPU's streams are synchronous (WaitMode::kSynchronous): its
  // calls on windows would be staged while its peers read the windows, so
  // no rank reads them.
  bool synchronousStreams = false;
  std::optional<NetLink> netLink;  // only the first node leader's names one
  MachineTopology machine;         // the facts writeMachineFacts carries
};
std::string encodeInitProposal(const InitProposal& proposal);
Result<InitProposal> decodeInitProposal(std::string_view bytes);

struct InitAgreement {
  // Every rank reads every peer's buffers (RankView::peerReads): never on a
  // device-direct communicator, whose buffers are device memory that no
  // host step reads and that device plans reach only inside windows (those
  // take their peer-reading plans apart: PlanCache::windowPlanFor). Threads
  // of one process could read each other's host buffers, but a plan chosen
  // for that would stage every large call on device buffers.
  bool everyoneReadsPeers = true;
  // Every rank proposed device-direct.
  bool deviceDirect = false;
  // Why not, when some rank could have been ("" otherwise): for the log.
  std::string notDeviceDirect;
  // Every rank proposed stream plans: the connections carry stream links
  // (the stream ring of cuda_ipc or loopback; ConnectOptions::streamLinks). Otherwise none
  // does, and a device-direct communicator runs device plans (the host
  // steps, the GPUs copy and reduce) on every rank alike.
  bool streamLinks = false;
  // Why not, when some rank proposed them ("" otherwise): for the log.
  std::string noStreamLinks;
  // The first rank that proposed fewHardwareQueues (-1: none): operations
  // on windows are staged on every rank, not read from the peers' windows.
  int rankWithFewQueues = -1;
  // The first rank that proposed synchronousStreams (-1: none): the same.
  int rankSynchronous = -1;
  std::optional<NetLink> netLink;
  MachineTopology machine;  // agreedMachine() of every rank's
};
// Pure and order-preserving: every rank passes the same proposals (rank
// order) and gets the same agreement. Two ranks naming different network
// links is the caller's bug (only one leader proposes): refused.
Result<InitAgreement> agree(const std::vector<InitProposal>& proposals);

// ncclCommSplit's arguments of one parent rank.
struct SplitRecord {
  int color = 0;  // < 0: NCCL_SPLIT_NOCOLOR
  int key = 0;
};
std::string encodeSplitRecord(const SplitRecord& record);
Result<SplitRecord> decodeSplitRecord(std::string_view bytes);

// ncclCommWindowRegister: one rank's buffer, and how a peer may map it.
struct WindowRecord {
  uint64_t address = 0;  // in the owner's address space
  uint64_t bytes = 0;
  bool deviceMemory = false;  // CUDA device memory (not managed, not host)
  // Host memory inside a shared allocation (memory/shared_memory.h): the
  // owner's pid (named so in its pid namespace) and the allocation's
  // sequence (0: none), the buffer's offset.
  int32_t pid = 0;
  uint64_t pidNamespace = 0;
  uint64_t sharedSequence = 0;
  uint64_t sharedOffset = 0;
  // Device memory inside a Shoal cuMem allocation: its serial (0: none),
  // size and the buffer's offset in it. The owner sends its descriptor to
  // the peers' mailboxes.
  uint64_t deviceSerial = 0;
  uint64_t deviceBytes = 0;
  uint64_t deviceOffset = 0;
  // Where this rank receives the peers' descriptors: an abstract Unix
  // socket name ("" in a process that does not use CUDA), reachable from
  // processes of its network namespace (core/process.h).
  std::string mailbox;
  uint64_t netNamespace = 0;
  uint32_t uid = 0;  // a mailbox takes only its user's connections
  // Registered with NCCL_WIN_COLL_SYMMETRIC: every rank passes its buffers
  // at the same offsets in the window (its operations may run on the
  // streams, comm/window_board.h).
  bool symmetric = false;
  // The rank's window board in its process (0: none, its streams run no
  // stream memory operations); sent with the descriptor to mailboxes.
  uint64_t boardAddress = 0;
  bool operator==(const WindowRecord&) const = default;
};
std::string encodeWindowRecord(const WindowRecord& record);
Result<WindowRecord> decodeWindowRecord(std::string_view bytes);

// One flag per rank from one rank, or its error: after the records, to
// whom it sent its descriptor; at the end, whose buffers it maps (or why it
// failed, which fails the registration on every rank).
struct WindowFlags {
  std::string error;
  std::vector<bool> flags;
  bool operator==(const WindowFlags&) const = default;
};
std::string encodeWindowFlags(const WindowFlags& flags);
Result<WindowFlags> decodeWindowFlags(std::string_view bytes);

}  // namespace shoal
