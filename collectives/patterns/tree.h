// Binary tree arithmetic over ring positions (for tree algorithms).
//
// Role: pure functions. Nodes are numbered 0..n-1 in breadth-first order with
// node 0 the root; callers map them to ranks (e.g. node v = ring position
// root + v). A complete binary tree: parent (v-1)/2, children 2v+1 and 2v+2.
#pragma once

#include <vector>

namespace shoal::patterns {

inline int treeParent(int node) { return node == 0 ? -1 : (node - 1) / 2; }

inline std::vector<int> treeChildren(int node, int n) {
  std::vector<int> children;
  for (int c = 2 * node + 1; c <= 2 * node + 2 && c < n; ++c) children.push_back(c);
  return children;
}

// Number of edges from node to the root.
inline int treeDepth(int node) {
  int depth = 0;
  for (; node > 0; node = treeParent(node)) ++depth;
  return depth;
}

}  // namespace shoal::patterns
