// Flags between the ranks of a fused tensor-parallel call, in GPU memory every rank maps (its
// own, or a peer's through CUDA IPC), each a 64-bit word: one thread raises a flag to the call's
// number, or waits until flags reach it, ordered on a stream like any kernel (capturable). The
// call's number lives in device memory, counted up by each call, so a graph's replays count too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fused/tp/device_list.hpp"
#include "weft/status.hpp"

namespace weft::fused::tp {

// *epoch += 1: the start of a call.
Status countCall(std::uint64_t* epoch, void* stream);
// *flag = *epoch · scale + plus (a call's steps: scale above the most steps, plus the step).
Status raiseFlag(std::uint64_t* flag, const std::uint64_t* epoch, void* stream,
                 std::uint64_t scale = 1, std::uint64_t plus = 0);
// Waits until each of `count` flags (the first at `first`, `strideBytes` apart; `skip` not
// waited for, -1: none) holds at least *epoch + delta. Past `timeoutNs` the kernel prints the flag
// it waited for and traps: the stream fails rather than hang on a dead peer.
Status awaitFlags(const std::uint64_t* first, std::size_t strideBytes, int count, int skip,
                  const std::uint64_t* epoch, std::int64_t delta, std::uint64_t timeoutNs,
                  void* stream);

// Flags anywhere (each rank's own, in its buffer), waited for or raised together.
using FlagList = DeviceList<std::uint64_t*>;
// Waits until every flag of `flags` holds at least *epoch · scale + plus (modulo 2⁶⁴: plus
// ~0 is *epoch - 1); traps past `timeoutNs`.
Status awaitEach(const FlagList& flags, const std::uint64_t* epoch, std::uint64_t scale,
                 std::uint64_t plus, std::uint64_t timeoutNs, void* stream);
// Every flag of `flags` = *epoch, in one kernel.
Status raiseEach(const FlagList& flags, const std::uint64_t* epoch, void* stream);

// An empty kernel: what a collective enqueued next on `stream` follows. The runtime may launch a
// collective's kernel as a programmatic dependent of the stream's previous kernel, early, its
// blocks holding SMs until that kernel ends; behind a GEMM of the caller's, ranks sharing a GPU
// could then hold every SM while one rank's GEMM waits for one.
Status settle(void* stream);
// Runs each kernel once on `words` (two of them, device memory) and waits: loaded before any of
// them spins (with lazy loading a kernel's first launch could wait for another rank's spinning
// one).
Status loadFlagKernels(std::uint64_t* words, void* stream);

}  // namespace weft::fused::tp
