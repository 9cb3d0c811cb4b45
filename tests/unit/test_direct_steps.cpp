// Which messages of a schedule go direct between hosts (straight from the sender's buffer into
// the receiver's): both ends must agree message by message, each must move one block of the
// caller's buffers to the same place of a segment, and a step that receives direct and sends on
// must send direct.
#include <gtest/gtest.h>

#include "algorithms/algorithm.hpp"
#include "src/exec/cpu_executor.hpp"

namespace weft::exec {
namespace {

using algo::Buf;
using algo::StepKind;

struct Counts {
  int sends = 0, receives = 0, sendingSteps = 0;
};

// Flags of channel 0's steps, summed over the ranks.
Counts countsOf(const std::string& algorithm, Collective coll, int n) {
  auto s = algo::findAlgorithm(algorithm)->build(coll, n);
  EXPECT_TRUE(s.isOk()) << s.status().toString();
  const DirectSteps d = directSteps(*s);
  Counts c;
  for (int r = 0; r < n; ++r) {
    const algo::Program& p = s->program(0, r);
    for (std::size_t i = 0; i < p.steps().size(); ++i) {
      const std::uint8_t f = d[0][static_cast<std::size_t>(r)][i];
      c.sends += (f & kSendsDirect) != 0;
      c.receives += (f & kReceivesDirect) != 0;
      c.sendingSteps += !p.sendPeers(p.steps()[i]).empty();
    }
  }
  return c;
}

TEST(DirectSteps, PairwiseAllToAllSendsEveryBlockDirect) {
  const Counts c = countsOf("pairwise", Collective::allToAll, 6);
  EXPECT_EQ(c.sends, c.sendingSteps);
  EXPECT_GT(c.sends, 0);
  EXPECT_GT(c.receives, 0);
}

TEST(DirectSteps, RingAllGatherSendsAndForwardsDirect) {
  const Counts c = countsOf("ring", Collective::allGather, 5);
  EXPECT_EQ(c.sends, c.sendingSteps);  // every rank: its own block, then three forwards
  EXPECT_EQ(c.receives, 5 * 4);
}

TEST(DirectSteps, RingAllReduceKeepsItsPartialSumsInSlots) {
  // The reduce-scatter half's partial sums are folded on arrival (and live in scratch); only the
  // all-gather half's forwards of finished blocks may go direct.
  auto s = algo::findAlgorithm("ring")->build(Collective::allReduce, 5);
  ASSERT_TRUE(s.isOk());
  const DirectSteps d = directSteps(*s);
  int direct = 0;
  for (int r = 0; r < 5; ++r) {
    const algo::Program& p = s->program(0, r);
    for (std::size_t i = 0; i < p.steps().size(); ++i) {
      const std::uint8_t f = d[0][static_cast<std::size_t>(r)][i];
      if (f == 0) continue;
      ++direct;
      // Forwards, and the last receive of each block.
      const StepKind k = p.steps()[i].kind;
      EXPECT_TRUE(k == StepKind::recvCopySend || (k == StepKind::recv && f == kReceivesDirect));
    }
  }
  EXPECT_GT(direct, 0);
}

// Over every algorithm and collective it serves, at 5 and 6 ranks: each message's two ends
// agree, and every direct message moves one block of the caller's buffers to the same place.
TEST(DirectSteps, BothEndsOfEveryMessageAgree) {
  for (const algo::Algorithm* a : algo::algorithms()) {
    for (Collective coll : kAllCollectives) {
      for (int n : {5, 6}) {
        auto s = a->build(coll, n);
        if (!s) continue;
        const DirectSteps d = directSteps(*s);
        const std::uint32_t B = std::max<std::uint32_t>(1, s->blocksPerSegment);
        for (std::size_t c = 0; c < s->channels.size(); ++c) {
          const auto N = static_cast<std::size_t>(n);
          // recvAt[q][r]: q's steps receiving from r, in order.
          std::vector<std::vector<std::vector<std::size_t>>> recvAt(
              N, std::vector<std::vector<std::size_t>>(N));
          for (std::size_t q = 0; q < N; ++q) {
            const algo::Program& p = s->program(c, static_cast<int>(q));
            for (std::size_t j = 0; j < p.steps().size(); ++j) {
              for (int r : p.recvPeers(p.steps()[j]))
                recvAt[q][static_cast<std::size_t>(r)].push_back(j);
            }
          }
          for (std::size_t r = 0; r < N; ++r) {
            const algo::Program& p = s->program(c, static_cast<int>(r));
            std::vector<std::size_t> sent(N, 0);
            for (std::size_t i = 0; i < p.steps().size(); ++i) {
              const algo::Step& st = p.steps()[i];
              const std::uint8_t f = d[c][r][i];
              const std::string where = std::string(a->name()) + " " + std::string(name(coll)) +
                                        " n=" + std::to_string(n) + " rank " + std::to_string(r) +
                                        " step " + std::to_string(i);
              if ((f & kSendsDirect) != 0) {
                EXPECT_TRUE(st.kind == StepKind::send || st.kind == StepKind::recvCopySend)
                    << where;
                EXPECT_EQ(p.blocks(st), 1u) << where;
              }
              if ((f & kReceivesDirect) != 0 && st.kind == StepKind::recvCopySend) {
                EXPECT_NE(f & kSendsDirect, 0) << where << ": receives direct, forwards by slot";
              }
              const auto named = st.kind == StepKind::send ? p.src(st) : p.dst(st);
              for (int q : p.sendPeers(st)) {
                const auto Q = static_cast<std::size_t>(q);
                ASSERT_LT(sent[Q], recvAt[Q][r].size()) << where;
                const std::size_t j = recvAt[Q][r][sent[Q]++];
                const algo::Program& theirs = s->program(c, q);
                const algo::Step& rs = theirs.steps()[j];
                const bool receives = (d[c][Q][j] & kReceivesDirect) != 0;
                EXPECT_EQ(receives, (f & kSendsDirect) != 0) << where << " to rank " << q;
                if (!receives) continue;
                const auto into = theirs.dst(rs);
                ASSERT_FALSE(named.empty());
                ASSERT_FALSE(into.empty());
                EXPECT_NE(named[0].buf, Buf::scratch) << where;
                EXPECT_NE(into[0].buf, Buf::scratch) << where;
                EXPECT_EQ(named[0].at(0) % B, into[0].at(0) % B) << where;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace weft::exec
