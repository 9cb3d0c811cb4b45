// The README's example: build a schedule, prove it, print it. Built with the project so it stays
// true.
#include <cstdio>

#include "algorithms/algorithm.hpp"
#include "algorithms/verifier.hpp"

int main() {
  auto s =
      weft::algo::patAlgorithm().build(weft::Collective::reduceScatter, 12, {.aggregation = 4});
  auto report = weft::algo::verify(*s);  // contributions exact, sends matched, no deadlock
  std::printf("%s: %.3f x message per rank\n", report.ok() ? "correct" : report.message.c_str(),
              report.maxBytes);
  std::puts(weft::algo::describe(*s, 0).c_str());  // rank 0's steps
  return report.ok() ? 0 : 1;
}
