// The algorithm registry: one explicit table of every collective algorithm
// (docs/design.md, Plans and Tuner).
//
// Role: the tuner (src/tuner) asks candidates(kind) for the algorithms of a
// collective, filters them with supports() and picks the cheapest estimate();
// the communicator then calls build(). Entries are immutable static data;
// every function here is pure and thread-safe.
//
// Cost model (docs/design.md, Tuner): alpha per message on the
// critical path, beta per byte over the busiest link, gamma per byte reduced.
// Estimates are in microseconds and only need to rank algorithms correctly.
#pragma once

#include <string_view>
#include <vector>

#include "collectives/plan.h"

namespace shoal {

struct CostParams {
  double alpha_us = 10.0;                          // per message
  double beta_us_per_byte = 1.0 / 1500.0;          // link: 1.5 GB/s
  double gamma_us_per_byte_reduce = 1.0 / 8000.0;  // reducer: 8 GB/s
  // Across nodes, alpha and beta are the network's; a message or byte that
  // stays inside a node costs these fractions of them (the node's link
  // against the network's; 1 on one node). Estimates apply them to the
  // rounds or phases that never cross a node boundary.
  double intra_alpha_scale = 1.0;
  double intra_beta_scale = 1.0;
  // Added to every message a rank waits for when the ranks of its node
  // outnumber the cores (the sender must first get a core); 0 otherwise.
  // Estimates charge it per message received, which exceeds the critical
  // path's messages where a rank waits on several peers in one round.
  double reschedule_us = 0.0;
};

using BuildFn = Plan (*)(const CollShape&, const RankView&, const AlgoParams&);
// What the transports allow (peer reads) reaches an algorithm through the
// RankView, which the communicator fills from Transport's capabilities.
using SupportsFn = bool (*)(const CollShape&, const RankView&);
using EstimateFn = double (*)(const CollShape&, const RankView&, const CostParams&);

struct AlgorithmEntry {
  CollKind kind;
  const char* name;  // lower case, unique per kind: "ring", "recursive_doubling", ...
  BuildFn build;
  SupportsFn supports;
  EstimateFn estimate;  // microseconds
};

// Every algorithm, in table order.
const std::vector<AlgorithmEntry>& algorithms();
// nullptr when no algorithm of that kind has that name.
const AlgorithmEntry* findAlgorithm(CollKind kind, std::string_view name);
// The algorithms of a collective, in table order (never empty).
std::vector<const AlgorithmEntry*> candidates(CollKind kind);

}  // namespace shoal
