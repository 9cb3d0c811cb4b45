// Mutation tests: break correct schedules the ways a generator bug would, and require the verifier
// to notice every time. One test per kind of mutation, across every algorithm.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "algorithms/algorithm.hpp"
#include "algorithms/verifier.hpp"

namespace weft::algo {
namespace {

BlockList fromSpans(std::span<const Span> spans) {
  BlockList out;
  for (const Span& sp : spans) {
    for (std::uint32_t i = 0; i < sp.count; ++i) out.add(sp.buf, sp.at(i));
  }
  return out;
}

// Moves the last step of p to position i.
void moveLastTo(Program& p, std::size_t i) {
  auto& steps = p.mutableSteps();
  std::rotate(steps.begin() + static_cast<std::ptrdiff_t>(i), steps.end() - 1, steps.end());
}

// Applies `mutate` to (a copy of) every correct schedule at a few sizes and ranks. mutate returns
// false where the mutation does not apply. Returns how many mutants were checked.
int forEachMutant(const std::function<bool(Schedule&, int rank, std::size_t step)>& mutate,
                  const std::function<void(const VerifyReport&, const std::string&)>& expect) {
  int checked = 0;
  for (const Algorithm* a : algorithms()) {
    for (Collective c : a->collectives()) {
      for (int n : {5, 8}) {
        Params params;
        params.root = 1;
        const Schedule base = *a->build(c, n, params);
        for (int rank : {0, 1, n - 1}) {
          for (std::size_t ch = 0; ch < base.channels.size(); ++ch) {
            const std::size_t nsteps = base.program(ch, rank).steps().size();
            for (std::size_t i = 0; i < nsteps; ++i) {
              Schedule mutant = base;
              // Mutate only channel ch: move it to the front so mutate() sees channel 0.
              std::swap(mutant.channels[0], mutant.channels[ch]);
              if (!mutate(mutant, rank, i)) continue;
              ++checked;
              const std::string what = std::string(a->name()) + " " + std::string(name(c)) +
                                       " n=" + std::to_string(n) + " rank " + std::to_string(rank) +
                                       " channel " + std::to_string(ch) + " step " +
                                       std::to_string(i);
              expect(verify(mutant), what);
            }
          }
        }
      }
    }
  }
  return checked;
}

void expectCaught(const VerifyReport& rep, const std::string& what) {
  EXPECT_FALSE(rep.ok()) << what << ": mutant passed";
}

TEST(Mutation, DroppedStep) {
  const int n = forEachMutant(
      [](Schedule& s, int rank, std::size_t i) {
        auto& steps = s.program(0, rank).mutableSteps();
        steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(i));
        return true;
      },
      expectCaught);
  EXPECT_GT(n, 500);
}

TEST(Mutation, DuplicatedReduce) {
  const int n = forEachMutant(
      [](Schedule& s, int rank, std::size_t i) {
        Program& p = s.program(0, rank);
        const Step st = p.steps()[i];
        if (!traits(st.kind).reduces || st.ndst == 0) return false;
        // Reduce the step's source into its destination once more: a contribution counted twice.
        p.reduceLocal(fromSpans(p.src(st)), fromSpans(p.dst(st)));
        moveLastTo(p, i + 1);
        return true;
      },
      [](const VerifyReport& rep, const std::string& what) {
        EXPECT_EQ(rep.fault, Fault::doubleCount) << what << ": " << rep.message;
      });
  EXPECT_GT(n, 50);
}

TEST(Mutation, SwappedPeer) {
  const int n = forEachMutant(
      [](Schedule& s, int rank, std::size_t i) {
        Program& p = s.program(0, rank);
        const Step st = p.steps()[i];
        if (st.nsend == 0) return false;
        auto peers = p.mutableSendPeers(st);
        // The next rank that is neither this one nor already a peer of the step.
        for (int k = 1; k < s.nranks; ++k) {
          const int q = (peers[0] + k) % s.nranks;
          if (q != rank && std::find(peers.begin(), peers.end(), q) == peers.end()) {
            peers[0] = q;
            return true;
          }
        }
        return false;
      },
      expectCaught);
  EXPECT_GT(n, 300);
}

TEST(Mutation, ReorderedSend) {
  const int n = forEachMutant(
      [](Schedule& s, int rank, std::size_t i) {
        Program& p = s.program(0, rank);
        auto& steps = p.mutableSteps();
        if (steps[i].nsend == 0) return false;
        // Swap with the next step that sends other data to the same first peer.
        const int peer = p.sendPeers(steps[i])[0];
        for (std::size_t j = i + 1; j < steps.size(); ++j) {
          if (steps[j].nsend == 0) continue;
          const auto others = p.sendPeers(steps[j]);
          if (std::find(others.begin(), others.end(), peer) == others.end()) continue;
          const bool sameData =
              steps[j].kind == steps[i].kind &&
              fromSpans(p.src(steps[j])).spans() == fromSpans(p.src(steps[i])).spans() &&
              fromSpans(p.dst(steps[j])).spans() == fromSpans(p.dst(steps[i])).spans();
          if (sameData) return false;
          std::swap(steps[i], steps[j]);
          return true;
        }
        return false;
      },
      expectCaught);
  EXPECT_GT(n, 150);
}

TEST(Mutation, WrongBlock) {
  const int n = forEachMutant(
      [](Schedule& s, int rank, std::size_t i) {
        Program& p = s.program(0, rank);
        const Step st = p.steps()[i];
        auto spans = st.nsrc > 0 ? p.mutableSrc(st) : p.mutableDst(st);
        Span& sp = spans[0];
        const std::uint32_t limit = sp.buf == Buf::input    ? s.inputBlocks()
                                    : sp.buf == Buf::output ? s.outputBlocks()
                                                            : s.scratchBlocks;
        if (sp.count != 1 || limit < 2) return false;
        sp.first = (sp.first + 1) % limit;
        return true;
      },
      expectCaught);
  EXPECT_GT(n, 300);
}

}  // namespace
}  // namespace weft::algo
