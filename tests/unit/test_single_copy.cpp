// Which steps of a schedule may send references instead of bytes (the executor's single-copy
// path): exactly those whose every receiver only copies the message out and whose named pieces
// the sender leaves alone for the rest of the pass.
#include <gtest/gtest.h>

#include "algorithms/algorithm.hpp"
#include "src/exec/cpu_executor.hpp"

namespace weft::exec {
namespace {

using algo::StepKind;

// The kinds of rank r's marked steps on channel 0, and of its unmarked steps that send.
struct Marks {
  std::vector<StepKind> marked, unmarked;
};

Marks marksOf(const std::string& algorithm, Collective coll, int n, int r) {
  auto s = algo::findAlgorithm(algorithm)->build(coll, n);
  EXPECT_TRUE(s.isOk()) << s.status().toString();
  const ReferenceSteps refs = referenceSteps(*s);
  const algo::Program& p = s->program(0, r);
  Marks m;
  for (std::size_t i = 0; i < p.steps().size(); ++i) {
    const algo::Step& st = p.steps()[i];
    if (p.sendPeers(st).empty()) {
      EXPECT_EQ(refs[0][static_cast<std::size_t>(r)][i], 0) << "a step that sends nothing";
      continue;
    }
    (refs[0][static_cast<std::size_t>(r)][i] != 0 ? m.marked : m.unmarked).push_back(st.kind);
  }
  return m;
}

TEST(SingleCopy, RingAllGatherNamesEveryPiece) {
  // Every message of a ring all-gather is copied out by its receiver and never rewritten.
  const Marks m = marksOf("ring", Collective::allGather, 5, 2);
  EXPECT_EQ(m.unmarked.size(), 0u);
  EXPECT_EQ(m.marked.size(), 4u);  // the first send and three forwards
}

TEST(SingleCopy, RingAllReduceNamesOnlyItsAllGatherHalf) {
  const Marks m = marksOf("ring", Collective::allReduce, 5, 1);
  for (StepKind k : m.marked) EXPECT_EQ(k, StepKind::recvCopySend);
  // The reduce-scatter half feeds reductions: its partial sums travel as bytes.
  for (StepKind k : m.unmarked) EXPECT_NE(k, StepKind::recvCopySend);
  EXPECT_FALSE(m.marked.empty());
  EXPECT_FALSE(m.unmarked.empty());
}

TEST(SingleCopy, TwoShotNamesItsFinalBlockNotItsInputs) {
  const Marks m = marksOf("twoshot", Collective::allReduce, 4, 3);
  ASSERT_EQ(m.marked.size(), 1u);  // the reduced block, sent to every peer
  EXPECT_EQ(m.marked[0], StepKind::send);
  EXPECT_FALSE(m.unmarked.empty());  // the inputs go to reductions
}

TEST(SingleCopy, EveryScheduleMarksOnlySendsToCopyingReceivers) {
  // Over every algorithm and collective it serves: a marked step is a send or a forward.
  for (const algo::Algorithm* a : algo::algorithms()) {
    for (Collective coll : kAllCollectives) {
      auto s = a->build(coll, 6);
      if (!s) continue;
      const ReferenceSteps refs = referenceSteps(*s);
      for (std::size_t c = 0; c < s->channels.size(); ++c) {
        for (int r = 0; r < 6; ++r) {
          const algo::Program& p = s->program(c, r);
          for (std::size_t i = 0; i < p.steps().size(); ++i) {
            if (refs[c][static_cast<std::size_t>(r)][i] == 0) continue;
            const StepKind k = p.steps()[i].kind;
            EXPECT_TRUE(k == StepKind::send || k == StepKind::recvCopySend)
                << a->name() << " " << name(coll);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace weft::exec

namespace weft::transport {
namespace {

// The read-rate floor: two windows in a row below it raise the rank's refusal, once; one slow
// window between fast ones does not; a floor of 0 never refuses.
TEST(ReadRate, TwoSlowWindowsInARowRefuseOnce) {
  std::atomic<std::uint32_t> refuse{0};
  int told = 0;
  double toldRate = 0;
  ReadRate rate(&refuse, 2.0);  // 2 GB/s: 2000 bytes a microsecond
  rate.onRefuse([&](double gbps) {
    ++told;
    toldRate = gbps;
  });
  const std::uint64_t piece = 128 * 1024, perWindow = ReadRate::kWindowBytes / piece;
  auto window = [&](double gbps) {
    bool refused = false;
    for (std::uint64_t i = 0; i < perWindow; ++i)
      refused = rate.record(piece, static_cast<double>(piece) / (gbps * 1e3)) || refused;
    return refused;
  };
  EXPECT_FALSE(window(10));
  EXPECT_FALSE(window(0.5));  // one slow window
  EXPECT_FALSE(window(10));   // ... then a fast one: the count starts again
  EXPECT_FALSE(window(0.5));
  EXPECT_EQ(refuse.load(), 0u);
  EXPECT_TRUE(window(0.5));  // the second in a row
  EXPECT_EQ(refuse.load(), 1u);
  EXPECT_EQ(told, 1);
  EXPECT_NEAR(toldRate, 0.5, 1e-9);
  EXPECT_FALSE(window(0.5));  // already refusing: not again
  EXPECT_FALSE(window(0.5));
  EXPECT_EQ(told, 1);
}

TEST(ReadRate, AFloorOfZeroNeverRefuses) {
  std::atomic<std::uint32_t> refuse{0};
  ReadRate rate(&refuse, 0);
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(rate.record(1 << 20, 1e6));
  EXPECT_EQ(refuse.load(), 0u);
}

}  // namespace
}  // namespace weft::transport
