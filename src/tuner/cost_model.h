// Cost model of the tuner: link costs per link class and the time of one
// candidate (algorithm, channels, segment size).
//
// Role: pure functions and plain values; the Tuner (tuner.h) enumerates
// candidates and keeps the cheapest. Thread-safe.
//
// Vocabulary (docs/design.md, Tuner):
//   alpha    microseconds per message (ping-pong half round trip).
//   beta     microseconds per byte over one link (one stream).
//   gamma    microseconds per byte reduced (the reducer, src/reduce).
//   wait     microseconds added to each message a rank waits for when the
//            node's ranks outnumber its cores (kOversubscribedWaitUs), else 0.
//   terms    an algorithm's registry estimate split into its four counts:
//            messages on the critical path (M), messages waited for (W: M,
//            or more where a round waits on several peers), bytes over the
//            busiest link (B) and bytes reduced (G), by evaluating it with
//            unit costs (every estimate is linear in them).
//   piece    one message after segmentation.
//
// The time of a candidate with c channels and segment s, per channel (the
// channel carries 1/c of the buffer; terms computed for that part):
//   message  B/M bytes (a pipelined chain: B, every hop forwards the part)
//   S        = max(1, message / s)              pieces per message
//   piece    = message / S
//   cache    = kCacheSpeedup when c x kSegmentsInFlight pieces (every
//              channel's) fit in this rank's share of the cache, else 1; the share
//              is max(L2, L3 total / ranks per node) on copy links and the L2
//              alone on net (a NIC's DMA fills a small part of the L3, and a
//              hypervisor may report the whole host's L3)
//   share    = ranks per node / cores when that exceeds 1 on copy links (the
//              ranks take turns on the cores for their copies), else 1
//   beta'    = beta share / cache on copy links (loopback, shm); on net
//              beta, except where the CPU moves the bytes through kernel
//              sockets (netSendsFromCache: tcp, ofi over tcp;ofi_rxm)
//              for min(G, B - G) of the bytes, standing for those reduced
//              and then sent on (exact for the ring AllReduce): beta / cache,
//              and only for pieces up to kSocketPieceMaxBytes
//   gamma'   = gamma share / cache
//   alpha'   = alpha + wait W / M + surcharge N / M     per message, where
//              N counts the messages that cross the network (the estimate
//              with inside-node messages at zero) and surcharge is
//              kSocketProviderMessageUs over ofi through kernel sockets,
//              else 0 (the net row of the link table is Shoal's tcp)
// ring-like (every rank sends each step; the estimate's M is sequential):
//   channel  = M S alpha' + body, where body is
//              copy links: B beta' + G gamma' (the rank's one thread does both)
//              net: max(B beta', G gamma') + min(B beta', G gamma') / S (the
//              kernel and NIC move one piece while the rank reduces another)
// pipelined chain of h hops (estimate assumes infinitely fine pipelining):
//   stage    = alpha' + piece beta' + piece (G/B) gamma'   (net: max of the two)
//   channel  = (h - 1 + S) stage
// and over the channels:
//   total    = channel * max(1, c / streams), or infinite when c > 1 and a
//              message is below the half-performance length alpha/beta: it
//              costs its latency whatever its size, so splitting it over
//              channels only multiplies messages.
// streams is how many channels add bandwidth on the link: 1 on copy links
// (each rank is one thread that copies its own bytes), and on net the cores
// each rank of a node may use for the network stack (cores / ranks per node,
// at most kMaxNetStreams).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "collectives/registry.h"
#include "core/status.h"
#include "topology/topology.h"

namespace shoal {

struct LinkModel {
  double alphaUs = 10.0;                 // per message
  double betaUsPerByte = 1.0 / 1500.0;   // 1.5 GB/s
  double gammaUsPerByte = 1.0 / 8000.0;  // reduction, 8 GB/s
};

// Indexed by LinkClass.
using LinkTable = std::array<LinkModel, kLinkClassCount>;

inline const LinkModel& linkFor(const LinkTable& t, LinkClass c) {
  return t[static_cast<size_t>(c)];
}

// Measured on the development machine (see cost_model.cc for the command).
LinkTable builtinLinkTable();

// SHOAL_TUNER_FILE format, one class a line ('#' starts a comment):
//   <class> <alpha_us> <beta_GBps> <gamma_GBps>     class: loopback, shm or net
// GB = 1e9 bytes. Classes not listed keep their value from base. A malformed
// line is an error naming origin and the line number.
Result<LinkTable> parseLinkTable(std::string_view text, std::string_view origin,
                                 const LinkTable& base);
Result<LinkTable> loadLinkTableFile(const std::string& path, const LinkTable& base);
// One line per class in the file format (logs, calibrate_links).
std::string formatLinkTable(const LinkTable& t);

// How much faster a reduction or copy runs when the received piece is still
// in cache: of the three streams a reduction touches (local operand, received
// operand, result) one no longer comes from memory, 3/2. calibrate_links
// prints the upper bound, every stream cache-resident (about 6 on the
// development VM).
inline constexpr double kCacheSpeedup = 1.5;
// Pieces of one channel a rank holds at once: two rounds in flight, each
// with a piece being sent and one being received.
inline constexpr int kSegmentsInFlight = 4;
// Net through kernel sockets (ModelContext::netSendsFromCache): the largest
// piece whose sends are credited with leaving from cache (its reduction keeps
// the cache credit whatever its size). On the development VM's veth links
// a ring AllReduce in 128 KiB pieces ran 1.3-2x slower than in 120 KiB or
// 131 068-byte ones over Shoal's tcp transport and libfabric's tcp provider
// alike (the cause in the kernel was not found; docs/decisions/0008).
// 120 KiB: the largest multiple of 8 KiB below 128 KiB; the tuner adds it to
// its segment sizes where the rule applies.
inline constexpr uint64_t kSocketPieceMaxBytes = 120 << 10;
// Through kernel sockets no collective's segment is 128 KiB: besides the
// AllReduce's slowdown above, messages of exactly 128 KiB (a ReduceScatter
// of 1 MiB in 128 KiB segments) drew calls of 3-10 ms in most launches on
// the development VM, and 120 KiB ones none (decision 0008, amendment
// "messages of exactly 128 KiB").
inline constexpr uint64_t kSocketPieceStallBytes = 128 << 10;
// libfabric's socket providers (ofi over tcp;ofi_rxm; other socket providers
// assumed alike) pay per received message four to six system calls more
// than Shoal's tcp transport: a poll of the endpoint's socket and signal
// pipe, a 9000-byte prefetch read before the rest, and a write and read of
// that pipe for the completion; about 1.2 us each on the development VM.
// Charged to each message that crosses the network where the transport
// between nodes is ofi through the CPU, so that its AllReduce takes larger
// pieces once their messages cost more than the cache saves (decision 0008,
// amendment "ofi's dearer messages"). Fitted, not calibrated: a SHOAL_TUNER_FILE net row measured
// over ofi would count it twice.
inline constexpr double kSocketProviderMessageUs = 5.0;
inline constexpr int kMaxNetStreams = 8;
// A message waited for when ranks outnumber cores: the waiting rank yields
// and its peer must get the core first. Fitted to 4 ranks on the 2-core
// development VM (2026-11-30): recursive doubling's two rounds against
// peer_read's three rounds of three messages each put the AllReduce
// crossover at 64-128 KiB as measured (a tie at 64 KiB, peer_read 1.4-2x
// faster at 128 KiB), where without it the model picked
// the six-step ring at 32-64 KiB (1.5-2x slower than both).
inline constexpr double kOversubscribedWaitUs = 3.5;

struct AlgorithmTerms {
  double messages = 0;      // M
  double linkBytes = 0;     // B
  double reducedBytes = 0;  // G
  double waits = 0;         // W
  double netMessages = 0;   // N: of M, those that cross the network
};
// What the model needs of the topology for one algorithm.
struct ModelContext {
  LinkModel link;                 // the slowest link class the algorithm crosses
  // Across nodes: a message and a byte inside a node relative to `link`
  // (CostParams::intra_*_scale), from the link table; 1 on one node.
  double intraAlphaScale = 1.0;
  double intraBetaScale = 1.0;
  bool copyLink = true;           // loopback or shm: the rank's thread moves the bytes
  // Net through kernel sockets (Transport::cpuCopiesBytes: Shoal's tcp, ofi
  // over tcp;ofi_rxm): the calling core copies every byte through the
  // kernel, so bytes it has just reduced leave from its cache.
  bool netSendsFromCache = false;
  int streams = 1;                // channels that add bandwidth
  uint64_t cacheShareBytes = 0;   // this rank's share of the cache
  double waitUs = 0;              // per message waited for (oversubscribed node)
  // Per message that crosses the network, on top of link.alphaUs
  // (kSocketProviderMessageUs over ofi through kernel sockets).
  double netMessageSurchargeUs = 0;
  int pipelineHops = 1;           // > 1: a pipelined chain of that many links
};

AlgorithmTerms decompose(const AlgorithmEntry& algorithm, const CollShape& shape,
                         const RankView& view, const ModelContext& ctx);

struct Candidate {
  int channels = 1;
  uint64_t segmentBytes = 1 << 20;
};

// Microseconds for the candidate; perChannel are the terms for 1/channels of
// the buffer.
double candidateCostUs(const AlgorithmTerms& perChannel, const ModelContext& ctx,
                       const Candidate& candidate);

}  // namespace shoal
