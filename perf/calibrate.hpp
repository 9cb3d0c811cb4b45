// weft-perf --calibrate FILE: measures, on weft-perf's communicator, the cost model's constants
// for the link class the runtime gives ranks on host memory (pcie: sharedMemoryRankGraph), and
// writes them (rank 0) as a tuning file for WEFT_TUNING_FILE:
//   hop latency       ll: an 8-byte message's one-way time (0 <-> 1 ping-pong, median);
//                     simple: a 64 KiB message's, less 64 KiB at the rate such messages stream
//   message overhead  the receiver's time per message of a long one-way stream of 8-byte ones
//   bandwidth scale   per-rank one-way bandwidth of 64 MiB messages with every pair streaming at
//                     once, over the graph's nominal copy rate
//   base latency      an 8-byte all-reduce per protocol, less what the model charges it besides
// Where the ranks span hosts, the network class too, between rank 0 and the first rank of another
// host (its hop latencies) and from every host's first rank to another's at once (net_gbs, the
// host graph's rate between hosts); the pcie keys then come from rank 0 and a rank on its host.
// Then prints what weftCommPlan picks before and after (a communicator made with the file).
// With --gpu it calibrates the GPU tuner instead: no point-to-point call takes GPU buffers, so it
// times forced ring and pairwise calls on GPU buffers (small ones per protocol, large ones with
// the bulk protocol) and fits the GPU tuner's model to them (algorithms/calibration_fit.hpp): the
// base and nvlink-hop latencies of both protocols, and the nvlink bandwidth scale.
// perf/README.md (Calibration) has the formulas.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "perf/bench.hpp"
#include "perf/control.hpp"
#include "perf/gpu.hpp"
#include "weft/status.hpp"
#include "weft/weft.hpp"

namespace weft::perf {

class Calibration {
 public:
  // `comm` is the run's communicator, `control` the harness's traffic on it.
  // `gpu`: the rank's device with --gpu (the GPU tuner is calibrated), else null.
  Calibration(ProcessContext& context, int thread, Comm& comm, Control& control, GpuRank* gpu);

  // Every rank calls it. A failure on rank 0 (the file) is its Status there; the other ranks
  // return ok and set `quietFailure`, so that the reason is printed once.
  Status run(bool& quietFailure);
  // Ends the calls of the communicators it made (the run's own is the caller's).
  void abort();

 private:
  // Rank 0's verdict on every rank: its Status there; elsewhere ok, with quietFailure set when
  // rank 0 failed.
  Status shareRank0(const Status& onRank0, bool& quietFailure);
  // `s` naming this rank, what it was doing, and with whom (peer -1: every rank).
  Status failed(const Status& s, const std::string& what, int peer) const;
  // Rank 0's median one-way time of `bytes` between ranks 0 and `peer` (half a round trip).
  Result<double> oneWayUs(std::size_t bytes, int rounds, int peer);
  // `peer`'s time per message of 8-byte messages streamed from rank 0.
  Result<double> perMessageUs(int messages, int peer);
  // GB/s per receiver of `bytes` messages streamed one way by each (sender, receiver) pair at
  // once, the slowest receiver counting.
  Result<double> streamGBs(std::size_t bytes, int messages,
                           const std::vector<std::pair<int, int>>& pairs);
  // The mean over ranks of an 8-byte all-reduce on `comm`.
  Result<double> allReduceUs(Comm& comm);
  // The host fp8 codec's encode rate on every rank at once (GB/s read + written), the mean.
  Result<double> hostCodecGBs();
  // What weftCommPlan picks on `comm` for a float call of weft-perf's size `bytes` on host
  // buffers, or on GPU buffers with --gpu.
  Result<std::string> planOf(Comm& comm, Collective c, std::size_t bytes);
  // The host's calibration, and the GPU tuner's (--gpu).
  Status runHost(bool& quietFailure);
  Status runGpu(bool& quietFailure);
  // The mean over ranks of the median batch's time per call of a float `c` of weft-perf's size
  // `bytes` on GPU buffers, `calls` calls a batch, each batch timed by events on the stream.
  Result<double> gpuCallUs(Comm& comm, Collective c, std::size_t bytes, int calls);
  // Rank 0 writes the tuning file whose text `rank0Text` makes (it runs on rank 0 only, and
  // prints what was measured), every rank learns whether that worked, then comparePicks.
  Status publish(bool& quietFailure, const std::function<Result<std::string>()>& rank0Text);
  // Before and after: what `comm_` and a communicator made with the file at `path` pick.
  Status comparePicks(const std::string& path);

  ProcessContext& ctx_;
  int thread_, rank_, nranks_;
  Comm& comm_;
  Control& control_;
  GpuRank* gpu_;
  std::vector<std::byte> buffer_;
  std::byte* deviceSend_ = nullptr;  // --gpu: the calls' buffers (the GpuRank frees them)
  std::byte* deviceRecv_ = nullptr;
  std::vector<Comm> made_;  // per protocol, then the one with the new file
};

}  // namespace weft::perf
