#include "perf/options.hpp"

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "algorithms/overlap.hpp"
#include "src/tools/cli.hpp"

namespace weft::perf {
namespace {

// nccl-tests' order for "-d all" and "-o all".
constexpr DataType kAllTypes[] = {DataType::i8,   DataType::u8,     DataType::i32,
                                  DataType::u32,  DataType::i64,    DataType::u64,
                                  DataType::f16,  DataType::f32,    DataType::f64,
                                  DataType::bf16, DataType::f8e4m3, DataType::f8e5m2};
constexpr RedOp kAllOps[] = {RedOp::sum, RedOp::prod, RedOp::max, RedOp::min, RedOp::avg};

std::string usageError(const std::string& what) {
  return "weft-perf: " + what + " (weft-perf --help lists the flags)";
}

// A comma-separated list of counts above 0 into `out` (replacing it); "" leaves it. False, with
// `bad` the item, where one is not such a count.
bool parseCounts(const std::string& text, std::vector<std::size_t>& out, std::string& bad) {
  if (text.empty()) return true;
  out.clear();
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v == 0) {
      bad = item;
      return false;
    }
    out.push_back(static_cast<std::size_t>(v));
  }
  return true;
}

}  // namespace

std::string_view tableName(DataType t) {
  switch (t) {
    case DataType::f64:
      return "double";
    case DataType::f32:
      return "float";
    case DataType::f16:
      return "half";
    case DataType::bf16:
      return "bfloat16";
    case DataType::f8e4m3:
      return "f8e4m3";
    case DataType::f8e5m2:
      return "f8e5m2";
    case DataType::i8:
      return "int8";
    case DataType::u8:
      return "uint8";
    case DataType::i32:
      return "int32";
    case DataType::u32:
      return "uint32";
    case DataType::i64:
      return "int64";
    case DataType::u64:
      return "uint64";
  }
  return "?";
}

std::string_view tableName(RedOp op) {
  return name(op);
}

std::optional<std::size_t> parseSize(std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !(value >= 0)) return std::nullopt;
  while (*end == ' ') ++end;
  double unit = 1;
  switch (*end) {
    case '\0':
      break;
    case 'k':
    case 'K':
      unit = 1024.0;
      break;
    case 'm':
    case 'M':
      unit = 1024.0 * 1024;
      break;
    case 'g':
    case 'G':
      unit = 1024.0 * 1024 * 1024;
      break;
    default:
      return std::nullopt;
  }
  // Like nccl-tests, whatever follows the unit letter ("1MB") is ignored.
  const double bytes = value * unit;
  if (bytes > 1e18) return std::nullopt;
  return static_cast<std::size_t>(bytes);
}

std::vector<std::size_t> sweepSizes(const Options& o) {
  std::vector<std::size_t> out;
  for (std::size_t size = o.minBytes; size <= o.maxBytes;
       size = o.stepFactor > 1 ? size * o.stepFactor : size + o.stepBytes) {
    out.push_back(size);
  }
  return out;
}

int maxLocalRanks() {
  return std::max(64, 8 * static_cast<int>(std::thread::hardware_concurrency()));
}

std::optional<Options> parseOptions(int argc, char** argv, int& exitCode) {
  // mpirun's spelling "-np N" for the fork launcher (CLI11 takes one-letter short options only),
  // and the GEMM's --m, --n and --k, which CLI11 2.4 refuses beside -m and -n (the H200 machine's
  // weft-perf threw at start): they are --gemm-m, --gemm-n and --gemm-k inside.
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& a : args) {
    if (a == "-np") a = "--np";
    for (const std::string d : {"--m", "--n", "--k"}) {
      if (a == d || a.rfind(d + "=", 0) == 0) a = "--gemm-" + a.substr(2);
    }
  }
  std::vector<char*> argvFixed;
  for (std::string& a : args) argvFixed.push_back(a.data());

  Options o;
  for (int i = 0; i < argc; ++i) o.commandLine += (i ? " " : "") + std::string(argv[i]);
  std::string collective, minBytes = "32M", maxBytes = "32M", stepBytes = "1M", type = "float",
                          op = "sum", compare, algos;
  int ngpus = 1, parallelInit = 0, streamNull = 0, timeoutS = 0, cpuTime = 0, registration = 0,
      blocking = 0;
  CLI::App app{"weft-perf: nccl-tests-compatible benchmark of weft's collectives"};
  tools::addVersionFlag(app, "weft-perf");
  app.add_option(
         "collective", collective,
         "allreduce, allgather, reducescatter, broadcast, reduce, alltoall, sendrecv; "
         "or ag-gemm, gemm-rs (the tensor-parallel GEMMs with their collective), attention, moe")
      ->required();
  std::string gemmM;
  app.add_option("--gemm-m", gemmM,
                 "(or --m) ag-gemm, gemm-rs: the GEMM's rows, a list (128,1024,4096,16384)");
  app.add_option("--gemm-n", o.gemmN,
                 "(or --n) ag-gemm, gemm-rs: the GEMM's columns (28672; gemm-rs 8192)");
  app.add_option("--gemm-k", o.gemmK,
                 "(or --k) ag-gemm, gemm-rs: the GEMM's depth (8192; gemm-rs 28672)");
  app.add_option("--rounds", o.tpRounds,
                 "ag-gemm, gemm-rs: each column timed this many times, the columns in turn, its "
                 "median printed (1)");
  std::string seqs;
  app.add_option("--seq", seqs, "attention: a sequence's tokens, a list (4096,16384)");
  app.add_option("--heads", o.attentionHeads, "attention: query heads (32)");
  app.add_option("--kv-heads", o.attentionKvHeads, "attention: K/V heads (8)");
  app.add_option("--dim", o.attentionDim, "attention: head dim, 64 or 128 (128)");
  int causal = 1;
  app.add_option("--causal", causal, "attention: 1 for the causal mask (1), 0 for none");
  std::string pass = "forward";
  app.add_option("--pass", pass, "attention: forward (the default) or backward");
  std::string moeTokens, dispatchType = "bf16";
  app.add_option("--tokens", moeTokens, "moe: each rank's tokens, a list (128,4096)");
  app.add_option("--hidden", o.moeHidden, "moe: a token's values (7168)");
  app.add_option("--topk", o.moeTopk, "moe: experts a token goes to (8)");
  app.add_option("--experts", o.moeExperts, "moe: experts over every rank (64)");
  app.add_option("--dispatch-dtype", dispatchType,
                 "moe: the dispatched values' type, bf16 or fp8 (e4m3, a scale per 128)");
  std::string fp8Scales;
  app.add_option("--fp8-scales", fp8Scales,
                 "ag-gemm, gemm-rs with -d e4m3: tensor (one scale each, the default) or block "
                 "(one per 128 values of A's rows and per 128x128 tile of B)");
  app.add_option("-b,--minbytes", minBytes, "smallest size (K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", maxBytes, "largest size")->capture_default_str();
  app.add_option("-i,--stepbytes", stepBytes, "size increment when stepfactor is 1")
      ->capture_default_str();
  app.add_option("-f,--stepfactor", o.stepFactor, "size multiplier")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmupIters, "warm-up iterations")->capture_default_str();
  app.add_option("-m,--agg_iters", o.aggIters, "calls aggregated in one weftGroupStart/End")
      ->capture_default_str();
  app.add_option("-N,--run_cycles", o.runCycles, "sweeps to run and print (0: forever)")
      ->capture_default_str();
  app.add_option("-c,--check", o.checkIters, "checked runs per size (0: no check)")
      ->capture_default_str();
  app.add_option("-o,--op", op, "sum, prod, min, max, avg or all")->capture_default_str();
  app.add_option("-d,--datatype", type,
                 "float, double, half, bfloat16, f8e4m3, f8e5m2, int8, uint8, int32, uint32, "
                 "int64, uint64 or all")
      ->capture_default_str();
  app.add_option("-r,--root", o.root, "root of broadcast/reduce (-1: every rank in turn)")
      ->capture_default_str();
  app.add_option("-z,--blocking", blocking, "barrier after every call (0/1)")
      ->capture_default_str();
  app.add_option("-a,--average", o.average,
                 "time reported: 0 rank 0's, 1 mean over ranks, 2 min, 3 max")
      ->capture_default_str();
  app.add_option("-t,--nthreads", o.threads, "ranks (threads) per process")->capture_default_str();
  app.add_option("-g,--ngpus", ngpus, "GPUs per thread: 1 (one rank per thread)")
      ->capture_default_str();
  app.add_option("-R,--local_register", registration,
                 "GPU memory: register the buffers with every communicator (weftCommRegister; "
                 "1 and 2 alike), so kernels may read peers' buffers in place; host memory: "
                 "allocate them with weftHostAlloc, so ranks in other processes may")
      ->capture_default_str();
  app.add_option("-p,--parallel_init", parallelInit, "accepted; ranks always init in parallel");
  app.add_option("-y,--stream_null", streamNull,
                 "accepted; every rank always uses its own non-blocking stream");
  app.add_option("-T,--timeout", timeoutS, "seconds before a stuck call fails (WEFT_TIMEOUT_S)");
  app.add_option("-G,--cudagraph", o.graphLaunches,
                 "capture the -n timed calls into a CUDA graph and time this many launches of it "
                 "(GPU memory)")
      ->capture_default_str();
  bool gpu = false, host = false;
  app.add_flag("--gpu", gpu,
               "buffers in GPU memory, one stream per rank (the default when this build has CUDA "
               "and a GPU is present)");
  app.add_flag("--host", host, "buffers in host memory, even where a GPU is present");
  app.add_option("-C,--report_cputime", cpuTime, "label the time column cputime (0/1)");
  auto* np =
      app.add_option("--np", o.processes,
                     "(or -np) fork this many local processes, -t ranks each, and wait for them");
  app.add_option("--compare", compare,
                 "also time the same calls through a peer library: mpi (host memory, under "
                 "mpirun) or nccl (GPU memory, one rank per GPU)");
  app.add_flag("--plain", o.plain,
               "print only nccl-tests' columns, for parsers that expect exactly thirteen");
  app.add_option("--json", o.jsonPath, "write every row to this JSON file");
  app.add_option(
      "--svg", o.svgPath,
      "plot time and bus bandwidth against size, with the pick at each size, to this SVG file");
  app.add_option("--algos", algos,
                 "also sweep with each algorithm forced, as ring,rhd or ring/ll (weft-plan list)");
  app.add_option("--compress", o.compressText,
                 "all-reduce, reduce-scatter or all-gather crossing as fp8: fp8e4m3:32, "
                 "fp8e5m2:128, ... (the selector decides; :always compresses every call); adds "
                 "the deviation from the exact results");
  app.add_option("--seed", o.seed, "seed of the checked data")->capture_default_str();
  app.add_option("--calibrate", o.calibratePath,
                 "instead of the sweep, measure the cost model's host constants (latencies, "
                 "per-message cost, bandwidth), or with --gpu the GPU tuner's, and write them to "
                 "this tuning file for WEFT_TUNING_FILE (needs 2 or more ranks)");
  app.footer(
      "Launch: under mpirun (one rank per process, rank 0's id sent with MPI_Bcast); with -np N "
      "(N local processes forked here); or with WEFT_COMM_ID=host:port plus WEFT_RANK and "
      "WEFT_NRANKS (process index and count) from any launcher. -t T makes every process T "
      "ranks.");
  if (auto rc = tools::parse(app, static_cast<int>(argvFixed.size()), argvFixed.data())) {
    exitCode = *rc;
    return std::nullopt;
  }

  auto fail = [&](const std::string& what) -> std::optional<Options> {
    std::fprintf(stderr, "%s\n", usageError(what).c_str());
    exitCode = tools::kExitUsage;
    return std::nullopt;
  };
  if (collective == "attention") {
    o.attention = true;
    collective = "allgather";
    type = "bfloat16";
  } else if (!seqs.empty()) {
    return fail("--seq shapes attention only");
  }
  if (collective == "moe") {
    o.moe = true;
    collective = "alltoall";
    type = "bfloat16";
  } else if (!moeTokens.empty()) {
    return fail("--tokens shapes moe only");
  }
  if (dispatchType != "bf16" && dispatchType != "fp8") return fail("--dispatch-dtype: bf16 or fp8");
  o.moeFp8 = dispatchType == "fp8";
  if (o.moeTopk < 1 || o.moeExperts < o.moeTopk || o.moeHidden == 0)
    return fail("--topk: 1 ... --experts, and --hidden above 0");
  std::string bad;
  if (!parseCounts(moeTokens, o.moeTokens, bad)) return fail("--tokens: bad count '" + bad + "'");
  if (causal != 0 && causal != 1) return fail("--causal: 0 or 1");
  o.attentionCausal = causal == 1;
  if (pass != "forward" && pass != "backward") return fail("--pass: forward or backward");
  o.attentionBackward = pass == "backward";
  if (!parseCounts(seqs, o.attentionSeq, bad)) return fail("--seq: bad length '" + bad + "'");
  if (collective == "ag-gemm" || collective == "gemm-rs") {
    const bool ag = collective == "ag-gemm";
    o.tp = ag ? TpMode::allGatherGemm : TpMode::gemmReduceScatter;
    collective = ag ? "allgather" : "reducescatter";
    type = type == "float" ? "bfloat16" : type;  // the GEMMs' usual type unless -d says
  } else if (!gemmM.empty() || o.gemmN != 0 || o.gemmK != 0 || !fp8Scales.empty()) {
    return fail("--m, --n, --k and --fp8-scales shape ag-gemm and gemm-rs only");
  }
  if (o.tpRounds < 1) return fail("--rounds must be at least 1");
  if (o.tpRounds != 1 && o.tp == TpMode::none) return fail("--rounds times ag-gemm and gemm-rs");
  if (!fp8Scales.empty() && fp8Scales != "tensor" && fp8Scales != "block")
    return fail("--fp8-scales " + fp8Scales + ": tensor or block");
  o.fp8Blocks = fp8Scales == "block";
  if (!gemmM.empty()) {
    o.gemmM.clear();
    std::stringstream rows(gemmM);
    for (std::string item; std::getline(rows, item, ',');) {
      auto v = parseSize(item);
      if (!v || *v == 0) return fail("--m: '" + item + "' is not a row count");
      o.gemmM.push_back(*v);
    }
  }
  auto coll = parseCollective(collective);
  if (!coll || *coll == Collective::allToAllv)
    return fail("unknown collective '" + collective +
                "': use allreduce, allgather, reducescatter, broadcast, reduce, alltoall or "
                "sendrecv");
  o.collective = *coll;
  auto lo = parseSize(minBytes), hi = parseSize(maxBytes), step = parseSize(stepBytes);
  if (!lo) return fail("invalid size specified for 'minbytes': " + minBytes);
  if (!hi) return fail("invalid size specified for 'maxbytes': " + maxBytes);
  if (!step) return fail("invalid size specified for 'stepbytes': " + stepBytes);
  o.minBytes = *lo;
  o.maxBytes = *hi;
  o.stepBytes = *step;
  if (o.minBytes > o.maxBytes)
    return fail("invalid sizes for 'minbytes' and 'maxbytes': " + std::to_string(o.minBytes) +
                " > " + std::to_string(o.maxBytes));
  if (o.stepFactor <= 1 && o.stepBytes == 0)
    return fail("stepbytes 0 with stepfactor 1 never ends");
  if (o.stepFactor > 1 && o.minBytes == 0) return fail("minbytes 0 with a stepfactor never grows");
  if (o.iters < 1 || o.warmupIters < 0 || o.aggIters < 1 || o.runCycles < 0 || o.checkIters < 0)
    return fail("iters and agg_iters must be >= 1; warmup_iters, run_cycles and check >= 0");
  if (o.average < 0 || o.average > 3) return fail("average must be 0, 1, 2 or 3");
  if (o.threads < 1) return fail("nthreads must be >= 1");
  if (ngpus != 1)
    return fail("-g " + std::to_string(ngpus) +
                ": weft-perf runs one rank per thread, each on one GPU (or host memory): use -g 1 "
                "and -t or -np for more ranks");
  if (o.graphLaunches < 0) return fail("-G must be >= 0");
  if (gpu && host) return fail("--gpu and --host: choose one");
  o.memory = gpu ? Memory::gpu : host ? Memory::host : Memory::automatic;
  if (o.graphLaunches > 0 && host)
    return fail("-G: CUDA graphs capture calls on GPU buffers; drop --host");
  if (o.graphLaunches > 0 && blocking != 0)
    return fail("-G with -z 1: a CUDA graph cannot hold the host barrier after each call");
  if (np->count() > 0 && o.processes < 1)
    return fail("-np " + std::to_string(o.processes) + ": the processes to fork must be 1 or more");
  if (const long ranks = static_cast<long>(std::max(o.processes, 1)) * o.threads;
      ranks > maxLocalRanks())
    return fail("-np " + std::to_string(std::max(o.processes, 1)) + " x -t " +
                std::to_string(o.threads) + " = " + std::to_string(ranks) +
                " ranks on this machine: at most " + std::to_string(maxLocalRanks()) +
                " (8 per hardware thread, or 64); across machines launch with mpirun");
  o.blocking = blocking != 0;
  o.reportCpuTime = cpuTime != 0;
  (void)parallelInit;
  (void)streamNull;
  o.registerBuffers = registration != 0;

  if (type == "all") {
    o.types.assign(std::begin(kAllTypes), std::end(kAllTypes));
  } else if (auto t = parseDataType(type)) {
    o.types = {*t};
  } else {
    return fail("unknown datatype '" + type +
                "': use float, double, half, bfloat16, f8e4m3, f8e5m2, int8, uint8, int32, "
                "uint32, int64, uint64 or all");
  }
  if (op == "all") {
    o.ops.assign(std::begin(kAllOps), std::end(kAllOps));
  } else if (auto r = parseRedOp(op)) {
    o.ops = {*r};
  } else {
    return fail("unknown op '" + op + "': use sum, prod, min, max, avg or all");
  }
  if (!compare.empty() && compare != "mpi" && compare != "nccl")
    return fail("--compare " + compare + ": the peers weft-perf knows are mpi and nccl");
  if (compare == "nccl" && host)
    return fail("--compare nccl times NCCL on GPU buffers; drop --host");
  if (compare == "mpi" && gpu) return fail("--compare mpi times MPI on host buffers; drop --gpu");
  o.compare = compare;
  std::stringstream list(algos);
  for (std::string item; std::getline(list, item, ',');) {
    if (item.empty()) continue;
    const auto slash = item.find('/');
    ForcedAlgorithm f{item.substr(0, slash),
                      slash == std::string::npos ? std::string() : item.substr(slash + 1)};
    if (f.algorithm.empty()) return fail("--algos: empty algorithm name in '" + algos + "'");
    o.algos.push_back(f);
  }
  if (o.tp != TpMode::none) {
    for (const ForcedAlgorithm& f : o.algos) {
      if (auto k = algo::parseTpChunks(f.algorithm); !k || !f.protocol.empty())
        return fail("--algos " + f.label() +
                    ": ag-gemm and gemm-rs take unfused, chunked:K, fused or fused:inplace");
    }
    for (DataType t : o.types) {
      if (t != DataType::bf16 && t != DataType::f16 && t != DataType::f32 && t != DataType::f8e4m3)
        return fail(std::string(tableName(t)) +
                    ": ag-gemm and gemm-rs multiply bfloat16, half, float or e4m3 (into bfloat16)");
    }
    if (host) return fail("ag-gemm and gemm-rs run on GPU memory; drop --host");
    if (!o.compressText.empty() || !o.calibratePath.empty() || !o.compare.empty() ||
        o.graphLaunches > 0)
      return fail("ag-gemm and gemm-rs take none of --compress, --calibrate, --compare, -G");
  }
  if (!o.compressText.empty()) {
    weftCompression w{};
    if (weftCompressionParse(o.compressText.c_str(), &w) != weftSuccess)
      return fail("--compress " + std::string(weftGetLastError()));
    if (o.collective != Collective::allReduce && o.collective != Collective::reduceScatter &&
        o.collective != Collective::allGather)
      return fail("--compress: only all-reduce, reduce-scatter and all-gather compress");
    for (DataType t : o.types) {
      if (t != DataType::bf16 && t != DataType::f16 && t != DataType::f32)
        return fail("--compress: " + std::string(tableName(t)) +
                    " cannot be compressed (bfloat16, half and float can)");
    }
    for (RedOp r : o.ops) {
      if (o.collective != Collective::allGather && r != RedOp::sum && r != RedOp::avg)
        return fail("--compress: " + std::string(tableName(r)) +
                    " cannot be compressed (sum and avg can)");
    }
    if (!o.calibratePath.empty()) return fail("--compress and --calibrate: choose one");
    o.compress = w;
  }
  if (!o.calibratePath.empty() &&
      (!o.compare.empty() || !o.algos.empty() || !o.jsonPath.empty() || !o.svgPath.empty()))
    return fail("--calibrate runs no sweep: drop --compare, --algos, --json and --svg");
  if (!o.calibratePath.empty() && o.graphLaunches > 0)
    return fail("--calibrate times calls launched one by one, as the tuner prices them: drop -G");
  if (timeoutS > 0 && std::getenv("WEFT_TIMEOUT_S") == nullptr) {
    // Read by every communicator this process creates; set before any exists.
    setenv("WEFT_TIMEOUT_S", std::to_string(timeoutS).c_str(), 1);
  }
  return o;
}

}  // namespace weft::perf
