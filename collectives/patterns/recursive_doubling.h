// Recursive doubling arithmetic, with the fold for a non-power-of-two size.
//
// Role: pure value. Of n participants, pof2 = the largest power of two <= n take
// part in log2(pof2) doubling rounds; the first 2*rem participants (rem = n -
// pof2) pair up first: the even one of each pair ("folded") gives its data to the
// odd one and gets the result back at the end. Participants are numbered
// 0..n-1 (callers use ring positions); "virtual" numbers 0..pof2-1 index the
// doubling participants.
#pragma once

namespace shoal::patterns {

class RecursiveDoubling {
 public:
  explicit RecursiveDoubling(int n) : n_(n) {
    pof2_ = 1;
    while (pof2_ * 2 <= n) pof2_ *= 2;
    rem_ = n - pof2_;
    rounds_ = 0;
    for (int p = 1; p < pof2_; p *= 2) ++rounds_;
  }

  int size() const { return n_; }
  int pof2() const { return pof2_; }
  int rounds() const { return rounds_; }  // log2(pof2)

  // True for the even member of a fold pair: it only sends its data and receives
  // the result.
  bool foldedOut(int p) const { return p < 2 * rem_ && p % 2 == 0; }
  // True for the odd member of a fold pair: it first receives from p - 1.
  bool foldsIn(int p) const { return p < 2 * rem_ && p % 2 == 1; }
  // Virtual number of a participant that is not folded out (-1 otherwise).
  int virtualOf(int p) const {
    if (foldedOut(p)) return -1;
    return p < 2 * rem_ ? p / 2 : p - rem_;
  }
  int participantOf(int v) const { return v < rem_ ? 2 * v + 1 : v + rem_; }
  // Partner of virtual participant v in round k (0-based).
  int partner(int v, int round) const { return v ^ (1 << round); }

 private:
  int n_ = 1, pof2_ = 1, rem_ = 0, rounds_ = 0;
};

}  // namespace shoal::patterns
