// weft-perf's command line: nccl-tests' flags with nccl-tests' defaults and meanings, plus the
// memory (--gpu, --host), launch (-np), comparison (--compare), export (--json, --svg), algorithm
// (--algos) and calibration (--calibrate) options.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weft/status.hpp"
#include "weft/types.hpp"
#include "weft/weft.h"

namespace weft::perf {

// One algorithm the sweep is repeated with: WEFT_ALGO (and WEFT_PROTO when given as "ring/ll")
// set while its communicator is created.
struct ForcedAlgorithm {
  std::string algorithm;
  std::string protocol;  // "" leaves WEFT_PROTO as the environment has it
  std::string label() const { return protocol.empty() ? algorithm : algorithm + "/" + protocol; }
};

// Where the buffers live. `automatic` is resolved by launchAndRun before any rank starts: GPU
// memory when the build has CUDA, a GPU is there and the run can use it; host memory otherwise.
enum class Memory { automatic, host, gpu };

// ag-gemm and gemm-rs (perf/tp_bench.hpp) instead of a collective's sweep.
enum class TpMode { none, allGatherGemm, gemmReduceScatter };

struct Options {
  Collective collective = Collective::allReduce;
  // ag-gemm / gemm-rs: the GEMM's rows swept, and its n and k (0: Llama-70B's MLP, n 28672 and
  // k 8192 for ag-gemm, the reverse for gemm-rs); --algos then names WEFT_TP_OVERLAP variants.
  TpMode tp = TpMode::none;
  std::vector<std::size_t> gemmM{128, 1024, 4096, 16384};
  std::size_t gemmN = 0, gemmK = 0;
  bool fp8Blocks = false;  // -d e4m3 with --fp8-scales block: DeepSeek-V3's 128-value blocks
  // --rounds: each column timed this many times, the columns in turn (every other round in
  // reverse), its median printed: a GPU whose clocks drift favours no column.
  int tpRounds = 1;
  // weft-perf attention (perf/attention_bench.hpp): one sequence of each --seq length.
  bool attention = false;
  std::vector<std::size_t> attentionSeq{4096, 16384};
  int attentionHeads = 32, attentionKvHeads = 8, attentionDim = 128;
  bool attentionCausal = true;
  bool attentionBackward = false;  // --pass backward
  // weft-perf moe (perf/moe_bench.hpp): dispatch and combine of each --tokens count.
  bool moe = false;
  std::vector<std::size_t> moeTokens{128, 4096};
  std::size_t moeHidden = 7168;
  int moeTopk = 8, moeExperts = 64;
  bool moeFp8 = false;  // --dispatch-dtype fp8: e4m3 rows with a scale per 128

  // The sweep: size = minBytes, then *stepFactor (when > 1) or +stepBytes, up to maxBytes.
  std::size_t minBytes = 32 << 20;
  std::size_t maxBytes = 32 << 20;
  std::size_t stepBytes = 1 << 20;
  std::size_t stepFactor = 1;
  int iters = 20;
  int warmupIters = 5;
  int aggIters = 1;
  int runCycles = 1;  // 0: forever
  int checkIters = 1;
  std::vector<DataType> types{DataType::f32};
  std::vector<RedOp> ops{RedOp::sum};
  int root = 0;  // -1: every rank in turn
  bool blocking = false;
  int average = 1;  // 0 rank 0, 1 mean, 2 min, 3 max
  bool reportCpuTime = false;

  Memory memory = Memory::automatic;  // --gpu, --host
  int graphLaunches = 0;              // -G: launches of a CUDA graph of the -n timed calls

  int threads = 1;  // ranks per process
  int processes =
      0;  // -np: ranks this command forks; 0: launched by mpirun, another launcher, or 1

  bool plain = false;   // only nccl-tests' thirteen columns (the extras still go to --json)
  std::string compare;  // "", "mpi" or "nccl"
  std::string jsonPath;
  std::string svgPath;
  std::vector<ForcedAlgorithm> algos;
  std::uint64_t seed = 0x5eed;
  // --calibrate: measure the cost model's host constants and write them here instead of sweeping.
  std::string calibratePath;
  // -R 1 (nccl-tests' local registration): the GPU buffers are plain cudaMalloc allocations,
  // registered with every communicator (weftCommRegister), so peers may read them in place.
  bool registerBuffers = false;

  // --compress: weft's all-reduces, reduce-scatters and all-gathers through weftAllReduceEx and
  // friends with this compression; #wrong then counts outputs that are not finite, and the
  // deviation from the exact results is reported beside.
  std::optional<weftCompression> compress;
  std::string compressText;

  std::string commandLine;  // as typed, for the JSON

  bool gpu() const { return memory == Memory::gpu; }
};

// The table's names for types and ops, as nccl-tests prints them ("float", "bfloat16", "sum").
std::string_view tableName(DataType t);
std::string_view tableName(RedOp op);

// nccl-tests' size syntax: a number with an optional K, M or G (powers of 1024): "8", "1M", "0.5G".
std::optional<std::size_t> parseSize(std::string_view text);

// The sizes of one sweep, in order.
std::vector<std::size_t> sweepSizes(const Options& o);

// The most ranks -np and -t may start on this machine: 8 per hardware thread, at least 64.
int maxLocalRanks();

// Parses argv. Returns the options, or nothing after printing help, the version or a usage error
// (exitCode says which: 0, or tools::kExitUsage).
std::optional<Options> parseOptions(int argc, char** argv, int& exitCode);

}  // namespace weft::perf
