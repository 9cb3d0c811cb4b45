// The verifier: runs a schedule symbolically and proves it correct.
//
// Every buffer block holds a set of contributions ("rank q's input block b") instead of numbers.
// Reductions take the union and fail on overlap (a double count), copies and messages move sets,
// and at the end every output block must hold exactly its expected set. Connections are FIFOs of
// `capacity` messages (default two) per (channel, sender, receiver); a step runs when every recv
// peer has a message waiting and every send peer has room. The step list is run `slices` times in a
// row, as the executor does, so a schedule that only works once is caught. Running out of runnable
// steps before every program ends is a deadlock; a message left in a FIFO is an unmatched send.
//
// The contract with executors: each connection has room for `capacity` messages of one slice
// (a message is up to maxMessageBlocks blocks' slices). Two is what a ring needs, since every rank
// receives and sends in the same step (NCCL likewise gives a chunk half of its FIFO). A program
// that is deadlock-free at some capacity stays so at any larger one: steps block only on their
// own FIFOs, and more room never takes a runnable step away.
#pragma once

#include <cstdint>
#include <string>

#include "algorithms/schedule.hpp"

namespace weft::algo {

enum class Fault : std::uint8_t {
  none,
  invalidStep,     // peer out of range or self, block out of range, operand missing, sizes differ
  deadlock,        // programs remain but no step can run
  unmatchedSend,   // a message was never received
  sizeMismatch,    // a recv expects a different number of blocks than was sent
  undefinedRead,   // a step reads a block nobody wrote
  doubleCount,     // a reduction combines a contribution with itself
  wrongResult,     // an output block does not hold its expected contributions
  forbiddenWrite,  // a step writes a buffer the collective must leave alone
};
std::string_view name(Fault f);

struct VerifyOptions {
  bool inPlace = false;  // alias input and output as the collective's in-place form does
  int slices = 2;        // how many times each program runs back to back
  int capacity = 2;      // messages each connection's FIFO holds
};

struct VerifyReport {
  Fault fault = Fault::none;
  std::string message;  // names the rank, channel, step and what went wrong

  // Costs of one pass (one slice), the largest over ranks.
  std::uint32_t maxSteps = 0;          // steps on all channels together
  std::uint32_t maxMessages = 0;       // messages sent
  double maxBytes = 0;                 // bytes sent, as a multiple of the message size
  double totalBytes = 0;               // the same summed over ranks
  std::uint32_t maxMessageBlocks = 0;  // the largest single message, in blocks
  // Memory traffic, as a multiple of the message size: every byte a rank reads (its sources,
  // each message out of its FIFO slot, the destination a local reduce folds into) or writes
  // (its destinations, each message into the receiver's slot). On ranks sharing one GPU all of
  // it goes through that device's memory.
  double maxMemory = 0;
  double totalMemory = 0;
  // Reduction work, as a multiple of the message size: the blocks a rank folds into another (a
  // step combining k inputs folds k - 1 of them), the largest over ranks.
  double maxReduced = 0;

  bool ok() const { return fault == Fault::none; }
};

VerifyReport verify(const Schedule& schedule, const VerifyOptions& options = {});

}  // namespace weft::algo
