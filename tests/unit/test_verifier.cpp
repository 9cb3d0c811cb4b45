// The verifier on hand-built schedules: every fault it names, and the FIFO contract.
#include <gtest/gtest.h>

#include "algorithms/algorithm.hpp"
#include "algorithms/verifier.hpp"

namespace weft::algo {
namespace {

using enum Buf;

Schedule twoRanks(Collective coll = Collective::allReduce) {
  return Schedule::make(coll, 2, "hand", 1);
}

// A correct two-rank all-reduce to start each case from.
Schedule exchange() {
  Schedule s = twoRanks();
  for (int r = 0; r < 2; ++r) {
    s.program(0, r).send({input, 0}, {1 - r});
    s.program(0, r).recvReduceCopy({1 - r}, {input, 0}, {output, 0});
  }
  return s;
}

TEST(Verifier, AcceptsACorrectSchedule) {
  const VerifyReport rep = verify(exchange());
  EXPECT_TRUE(rep.ok()) << rep.message;
  EXPECT_EQ(rep.maxSteps, 2u);
  EXPECT_EQ(rep.maxMessages, 1u);
  EXPECT_DOUBLE_EQ(rep.maxBytes, 1.0);
  EXPECT_DOUBLE_EQ(rep.totalBytes, 2.0);
}

TEST(Verifier, InvalidPeer) {
  Schedule s = exchange();
  s.program(0, 0).send({input, 0}, {2});
  const VerifyReport rep = verify(s);
  EXPECT_EQ(rep.fault, Fault::invalidStep);
  EXPECT_NE(rep.message.find("peer 2 out of range"), std::string::npos) << rep.message;
  EXPECT_NE(rep.message.find("rank 0 channel 0 step 2"), std::string::npos) << rep.message;
}

TEST(Verifier, SelfPeer) {
  Schedule s = twoRanks();
  s.program(0, 0).send({input, 0}, {0});
  EXPECT_EQ(verify(s).fault, Fault::invalidStep);
}

TEST(Verifier, BlockOutOfRange) {
  Schedule s = twoRanks();
  s.program(0, 0).copy({input, 0}, {output, 1});
  const VerifyReport rep = verify(s);
  EXPECT_EQ(rep.fault, Fault::invalidStep);
  EXPECT_NE(rep.message.find("out block 1 out of range"), std::string::npos) << rep.message;
}

TEST(Verifier, WritingTheInputIsInvalid) {
  Schedule s = twoRanks();
  s.program(0, 0).copy({output, 0}, {input, 0});
  const VerifyReport rep = verify(s);
  EXPECT_EQ(rep.fault, Fault::invalidStep);
  EXPECT_NE(rep.message.find("writes the input"), std::string::npos) << rep.message;
}

TEST(Verifier, MissingOperand) {
  Schedule s = twoRanks();
  s.program(0, 0).add(StepKind::recvReduceCopy, {1}, {}, {}, BlockList(output, 0));
  EXPECT_EQ(verify(s).fault, Fault::invalidStep);
}

TEST(Verifier, Deadlock) {
  Schedule s = twoRanks();
  for (int r = 0; r < 2; ++r) {
    s.program(0, r).recvReduceCopy({1 - r}, {input, 0}, {output, 0});
    s.program(0, r).send({input, 0}, {1 - r});
  }
  const VerifyReport rep = verify(s);
  EXPECT_EQ(rep.fault, Fault::deadlock);
  EXPECT_NE(rep.message.find("waits for a message from rank 1"), std::string::npos) << rep.message;
}

TEST(Verifier, UnmatchedSend) {
  Schedule s = exchange();
  s.program(0, 0).send({input, 0}, {1});
  const VerifyReport rep = verify(s, {false, 1});
  EXPECT_EQ(rep.fault, Fault::unmatchedSend);
  EXPECT_NE(rep.message.find("never received"), std::string::npos) << rep.message;
}

TEST(Verifier, SizeMismatch) {
  Schedule s = Schedule::make(Collective::allReduce, 2, "hand", 2);
  s.program(0, 0).send(range(input, 0, 2), {1});
  s.program(0, 1).recvReduceCopy({0}, {input, 0}, {output, 0});
  EXPECT_EQ(verify(s).fault, Fault::sizeMismatch);
}

TEST(Verifier, UndefinedRead) {
  Schedule s = twoRanks();
  s.program(0, 0).send({output, 0}, {1});
  s.program(0, 1).recv(0, {output, 0});
  const VerifyReport rep = verify(s);
  EXPECT_EQ(rep.fault, Fault::undefinedRead);
  EXPECT_NE(rep.message.find("before anything was written"), std::string::npos) << rep.message;
}

TEST(Verifier, DoubleCount) {
  Schedule s = exchange();
  s.program(0, 0).reduceLocal({input, 0}, {output, 0});
  EXPECT_EQ(verify(s).fault, Fault::doubleCount);
}

TEST(Verifier, WrongResult) {
  Schedule s = twoRanks();
  for (int r = 0; r < 2; ++r) s.program(0, r).copy({input, 0}, {output, 0});
  const VerifyReport rep = verify(s);
  EXPECT_EQ(rep.fault, Fault::wrongResult);
  EXPECT_NE(rep.message.find("expected {r0.in0..r1.in0}"), std::string::npos) << rep.message;
}

TEST(Verifier, ReduceMustNotWriteNonRootOutputs) {
  Schedule s = Schedule::make(Collective::reduce, 2, "hand", 1);
  s.program(0, 1).copy({input, 0}, {output, 0});
  s.program(0, 1).send({input, 0}, {0});
  s.program(0, 0).recvReduceCopy({1}, {input, 0}, {output, 0});
  EXPECT_EQ(verify(s).fault, Fault::forbiddenWrite);
}

TEST(Verifier, InPlaceCatchesReadingOverwrittenInput) {
  // Receiving into the output before sending the input is fine out of place, wrong in place.
  Schedule s = Schedule::make(Collective::allToAll, 2, "hand", 1);
  for (int r = 0; r < 2; ++r) {
    const auto own = static_cast<std::uint32_t>(r), peer = static_cast<std::uint32_t>(1 - r);
    s.program(0, r).copy({input, own}, {output, own});
    s.program(0, r).recv(1 - r, {output, peer});
    s.program(0, r).send({input, peer}, {1 - r});
  }
  // Both ranks receive first: that deadlocks. Put one rank's send first.
  auto& steps = s.program(0, 0).mutableSteps();
  std::swap(steps[1], steps[2]);
  EXPECT_TRUE(verify(s, {false, 2}).ok()) << verify(s, {false, 2}).message;
  EXPECT_EQ(verify(s, {true, 2}).fault, Fault::wrongResult);
}

TEST(Verifier, ScratchAndReduceLocalHoldOverRepeatedPasses) {
  // Each pass (slice) has its own state: a message received into scratch and accumulated into
  // the output stays correct on every one of three passes.
  Schedule s = twoRanks();
  for (int r = 0; r < 2; ++r) {
    s.program(0, r).copy({input, 0}, {output, 0});
    s.program(0, r).send({input, 0}, {1 - r});
    s.program(0, r).recv(1 - r, {scratch, 0});
    s.program(0, r).reduceLocal({scratch, 0}, {output, 0});
  }
  s.scratchBlocks = 1;
  EXPECT_TRUE(verify(s, {false, 3}).ok());
}

TEST(Verifier, RingNeedsTwoMessagesOfRoomPerConnection) {
  const Schedule ring = *ringAlgorithm().build(Collective::allReduce, 4);
  VerifyOptions opt;
  opt.capacity = 1;
  EXPECT_EQ(verify(ring, opt).fault, Fault::deadlock);
  opt.capacity = 2;
  EXPECT_TRUE(verify(ring, opt).ok());
  opt.capacity = 5;
  EXPECT_TRUE(verify(ring, opt).ok());
}

TEST(Verifier, RejectsBadOptions) {
  VerifyOptions opt;
  opt.slices = 0;
  EXPECT_EQ(verify(exchange(), opt).fault, Fault::invalidStep);
}

}  // namespace
}  // namespace weft::algo
