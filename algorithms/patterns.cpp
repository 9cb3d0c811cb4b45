#include "algorithms/patterns.hpp"

namespace weft::algo {

std::vector<TreeNode> binaryTree(int n) {
  std::vector<TreeNode> nodes(static_cast<std::size_t>(n));
  for (int p = 0; p < n; ++p) {
    const int up = binaryTreeParent(p, n);
    nodes[static_cast<std::size_t>(p)].parent = up;
    if (up >= 0) nodes[static_cast<std::size_t>(up)].children.push_back(p);
  }
  return nodes;
}

}  // namespace weft::algo
