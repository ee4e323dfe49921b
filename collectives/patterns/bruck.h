// Bruck's rounds, with block runs relative to a participant.
//
// Role: pure value. Of n participants, round k (k = 0..ceil(log2 n)-1) pairs
// each participant i with the ones at distance d = 2^k and moves
// min(d, n - d) consecutive blocks. AllGather: i sends its first `blocks`
// relative blocks (i, i+1, ...) to i - d and receives blocks i+d, ... from
// i + d, so after round k it holds min(2d, n) blocks starting at its own.
// ReduceScatter runs the same rounds transposed and in reverse order: sends
// become receives, copies become sums, so every contribution to block j is
// added exactly once on its way to participant j.
#pragma once

#include <vector>

namespace shoal::patterns {

struct BruckRound {
  int distance = 1;
  int blocks = 1;
};

inline std::vector<BruckRound> bruckRounds(int n) {
  std::vector<BruckRound> rounds;
  for (int d = 1; d < n; d *= 2) rounds.push_back(BruckRound{d, d < n - d ? d : n - d});
  return rounds;
}

}  // namespace shoal::patterns
