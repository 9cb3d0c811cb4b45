#include "perf/bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "algorithms/schedule.hpp"
#include "perf/attention_bench.hpp"
#include "perf/calibrate.hpp"
#include "perf/collective.hpp"
#include "perf/control.hpp"
#include "perf/data_check.hpp"
#include "perf/gpu.hpp"
#include "perf/moe_bench.hpp"
#include "perf/report.hpp"
#include "perf/tp_bench.hpp"
#include "weft/weft.hpp"

namespace weft::perf {
namespace {

// Page-aligned host buffers, touched once so that no timed call pays a first-touch fault; with
// -R on host memory, weftHostAlloc's, which ranks in other processes read in place.
struct HostDeleter {
  bool shared = false;
  void operator()(std::byte* p) const {
    if (shared) {
      (void)weftHostFree(p);
    } else {
      std::free(p);
    }
  }
};
using Buffer = std::unique_ptr<std::byte[], HostDeleter>;

Buffer allocate(std::size_t bytes, bool shared) {
  if (shared) {
    void* p = nullptr;
    if (weftHostAlloc(&p, bytes) != weftSuccess) return Buffer(nullptr, HostDeleter{true});
    std::memset(p, 0, bytes);
    return Buffer(static_cast<std::byte*>(p), HostDeleter{true});
  }
  auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, bytes));
  if (p != nullptr) std::memset(p, 0, bytes);
  return Buffer(p);
}

class RankBench {
 public:
  RankBench(ProcessContext& context, int thread)
      : ctx_(context),
        opt_(context.options),
        thread_(thread),
        rank_(context.proc * context.options.threads + thread),
        nranks_(context.nprocs * context.options.threads) {}

  Status run();
  // Ends every call of every communicator of this run, on every rank.
  void abort();
  int exitCode() const { return exitCode_; }

 private:
  Status join();
  Status preamble();
  Status joinForced();
  Status registerBuffers();
  Status sweep(DataType type, std::optional<RedOp> op, int root);
  Status warmUp(weftComm_t comm, std::optional<std::size_t> forced, DataType type, RedOp op,
                int root);
  Status runRow(std::size_t size, DataType type, std::optional<RedOp> op, int root);
  Result<Measurement> measure(weftComm_t comm, const Layout& l, DataType type,
                              std::optional<RedOp> op, int root, bool inPlace);
  // One checked run: the elements that are wrong on every rank (--compress: not finite), and
  // with --compress the deviation (the largest over ranks, and the ranks' mean).
  struct Checked {
    std::int64_t wrong = 0;
    std::optional<double> maxRel, meanRel;
  };
  Result<Checked> check(weftComm_t comm, const Layout& l, DataType type, std::optional<RedOp> op,
                        int root, bool inPlace);
  Status callAt(weftComm_t comm, const Layout& l, DataType type, RedOp op, int root, bool inPlace,
                std::size_t shift);
  // `forced`: the --algos entry whose communicator `comm` is; nothing: the tuned one.
  Result<std::string> planOf(weftComm_t comm, std::optional<std::size_t> forced, const Layout& l,
                             DataType type) const;
  // The timed calls: -n iterations of -m calls each, from the next slice of the buffers each.
  Status enqueueTimed(weftComm_t comm, const Layout& l, DataType type, RedOp op, int root,
                      bool inPlace);
  // Seconds per call of the timed loop on GPU buffers (CUDA events on the rank's stream).
  Result<double> timeOnGpu(weftComm_t comm, const Layout& l, DataType type, RedOp op, int root,
                           bool inPlace);
  // Waits for this rank's stream and reports an error any of its calls met after enqueueing.
  Status finishGpu(weftComm_t comm);
  Status joinPeer();
  Peer* peer() const { return ctx_.peer != nullptr ? ctx_.peer : ownPeer_.get(); }
  // The buffers the calls take: device memory on GPU, else the host buffers.
  std::byte* sendBuffer() const { return gpu_ ? deviceSend_ : send_.get(); }
  std::byte* recvBuffer() const { return gpu_ ? deviceRecv_ : recv_.get(); }
  bool serves(std::size_t k, const std::string& plan) const;

  ProcessContext& ctx_;
  const Options& opt_;
  int thread_, rank_, nranks_;
  std::optional<Comm> comm_;  // the tuned sweep's communicator; also carries Control
  std::optional<Control> control_;
  std::vector<Comm> forced_;                  // one per --algos entry
  std::unique_ptr<Calibration> calibration_;  // --calibrate
  std::size_t bufferBytes_ = 0;
  // Host memory: the buffers of the calls. GPU memory: where checked data is made and read
  // before it is copied in and after it is copied out.
  Buffer send_, recv_;
  std::unique_ptr<GpuRank> gpu_;  // GPU memory: this rank's device and stream
  std::byte* deviceSend_ = nullptr;
  std::byte* deviceRecv_ = nullptr;
  std::unique_ptr<Peer> ownPeer_;   // --compare nccl
  std::string peerNote_;            // --compare nccl: which NCCL, or why it does not run
  std::unique_ptr<Report> report_;  // rank 0 only
  std::uint64_t checks_ = 0;        // checked runs so far: the seed of the next one
  int exitCode_ = kExitOk;
};

Status RankBench::join() {
  // The device first: the communicator's GPU transport takes this thread's current device.
  Status gpuStatus;
  if (opt_.gpu()) {
    auto gpu = GpuRank::create(rank_);
    if (gpu) {
      gpu_ = std::move(*gpu);
    } else {
      gpuStatus = gpu.status();
    }
  }
  auto comm = Comm::initRank(nranks_, UniqueId{ctx_.id}, rank_);
  if (!comm) return comm.status();
  comm_.emplace(std::move(*comm));
  control_.emplace(comm_->handle(), nranks_);
  // Every rank runs on the memory every other does, or none runs (under mpirun each process
  // looked for a GPU by itself).
  auto ready = control_->sum(opt_.gpu() && gpuStatus.isOk() ? 1 : 0);
  if (!ready) return ready.status();
  if (!gpuStatus.isOk()) return gpuStatus;
  if (opt_.gpu() && *ready != nranks_)
    return {Code::unsupported, "rank " + std::to_string(rank_) + ": only " +
                                   std::to_string(*ready) + " of " + std::to_string(nranks_) +
                                   " ranks could use a GPU; run all on host memory (--host)"};
  if (!opt_.calibratePath.empty()) return {};  // no sweep: the calibration has its own buffer
  // Every size's buffers fit in maxBytes (the larger buffer is the size column).
  bufferBytes_ = (std::max<std::size_t>(opt_.maxBytes, 64) + 4095) / 4096 * 4096;
  const bool shared = opt_.registerBuffers && !gpu_;
  send_ = allocate(bufferBytes_, shared);
  recv_ = allocate(bufferBytes_, shared);
  if (!send_ || !recv_)
    return {Code::systemError, "rank " + std::to_string(rank_) + ": cannot allocate two " +
                                   std::to_string(bufferBytes_) + "-byte buffers; lower -e"};
  if (gpu_) {
    auto send = gpu_->allocate(bufferBytes_, opt_.registerBuffers);
    if (!send) return send.status();
    auto recv = gpu_->allocate(bufferBytes_, opt_.registerBuffers);
    if (!recv) return recv.status();
    deviceSend_ = *send;
    deviceRecv_ = *recv;
  }
  return {};
}

Status RankBench::joinPeer() {
  if (opt_.compare != "nccl" || !gpu_) return {};
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  auto joined = joinNccl(*control_, gpu_->stream(), rank_, nranks_, host, gpu_->busId());
  if (!joined) return joined.status();
  ownPeer_ = std::move(joined->peer);
  peerNote_ = ownPeer_ ? "compared with " + joined->description +
                             " on the same buffers and stream: ratio = its time / weft's "
                             "out-of-place time"
                       : "--compare nccl: no NCCL time (N/A): " + joined->why;
  return {};
}

Status RankBench::preamble() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string summary = comm_->summary();
  // "rank 3 of 4, host memory, ..." -> "host memory, ..."
  if (auto comma = summary.find(", "); comma != std::string::npos) summary.erase(0, comma + 2);
  char line[512];  // past the 255-byte host name and the rest
  if (gpu_) {
    // As nccl-tests names a rank's GPU: its index, PCI bus and name.
    std::snprintf(line, sizeof line, "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s",
                  rank_, 0, static_cast<int>(getpid()), host, gpu_->device(), gpu_->busId().c_str(),
                  gpu_->name().c_str());
  } else {
    std::snprintf(line, sizeof line,
                  "#  Rank %2d Group %2d Pid %6d on %10s device %2d [host] weft %s", rank_, 0,
                  static_cast<int>(getpid()), host, -1, summary.c_str());
  }
  auto lines = control_->gather(line);
  if (!lines) return lines.status();
  if (rank_ != 0) return {};
  report_ = std::make_unique<Report>(opt_, nranks_, opt_.compare);
  const std::string memory =
      gpu_ ? "GPU memory (cudaMallocAsync; each rank its own non-blocking stream, device rank % "
             "GPUs; times from CUDA events" +
                 std::string(opt_.graphLaunches > 0
                                 ? ", " + std::to_string(opt_.graphLaunches) +
                                       " launches of a CUDA graph of the -n timed calls)"
                                 : ")")
      : opt_.registerBuffers ? "host memory (weftHostAlloc, -R: read in place between processes)"
                             : "host memory";
  std::vector<std::string> notes = {
      "weft " + std::to_string(WEFT_VERSION_MAJOR) + "." + std::to_string(WEFT_VERSION_MINOR) +
          "." + std::to_string(WEFT_VERSION_PATCH) + ", " + memory + ": " +
          std::to_string(nranks_) + " rank(s) = " + std::to_string(ctx_.nprocs) +
          " process(es) x " + std::to_string(opt_.threads) + " thread(s), " + ctx_.launch,
      std::string("check: ") + (opt_.checkIters > 0
                                    ? "inputs from (seed, rank, index), outputs poisoned; exact "
                                      "but for float sums past 2^p/nranks (perf/README.md)"
                                    : "off (-c 0)")};
  if (!opt_.algos.empty()) {
    std::string list;
    for (const ForcedAlgorithm& f : opt_.algos) list += (list.empty() ? "" : ", ") + f.label();
    notes.push_back(
        "forced algorithms (WEFT_ALGO at communicator creation; n/a where the "
        "algorithm does not serve the call): " +
        list);
  }
  if (!opt_.calibratePath.empty())
    notes.push_back(std::string("--calibrate: no sweep; measures the cost model's ") +
                    (gpu_ ? "GPU tuner's constants on GPU buffers" : "host constants") +
                    " and writes " + opt_.calibratePath + " (perf/README.md, Calibration)");
  if (gpu_)
    notes.push_back("algo/proto: the GPU tuner's pick (weftCommPlanMemory with weftGpuMemory)");
  if (ctx_.peer)
    notes.push_back("compared with " + ctx_.peer->name() +
                    ": ratio = its time / weft's out-of-place time");
  if (!peerNote_.empty()) notes.push_back(peerNote_);
  report_->printPreamble(*lines, notes);
  return {};
}

Status RankBench::registerBuffers() {
  // -R: every communicator may read the peers' buffers in place (handles freed with the
  // communicators).
  if (!opt_.registerBuffers || !gpu_) return {};
  std::vector<Comm*> all{&*comm_};
  for (Comm& c : forced_) all.push_back(&c);
  for (Comm* c : all) {
    for (std::byte* b : {deviceSend_, deviceRecv_}) {
      if (auto h = c->registerBuffer(b, bufferBytes_); !h)
        return {h.status().code(), "-R: " + h.status().message()};
    }
  }
  return {};
}

Status RankBench::joinForced() {
  // The tuner reads WEFT_ALGO and WEFT_PROTO when a communicator is created.
  const std::optional<std::string> proto = environment("WEFT_PROTO");
  for (const ForcedAlgorithm& f : opt_.algos) {
    auto comm = joinWithEnvironment(
        ctx_, thread_, rank_, nranks_, *control_,
        {{"WEFT_ALGO", f.algorithm}, {"WEFT_PROTO", f.protocol.empty() ? proto : f.protocol}});
    if (!comm)
      return {comm.status().code(), "--algos " + f.label() + ": " + comm.status().message()};
    forced_.push_back(std::move(*comm));
  }
  return {};
}

Result<std::string> RankBench::planOf(weftComm_t comm, std::optional<std::size_t>, const Layout& l,
                                      DataType type) const {
  // GPU buffers are planned by the communicator's GPU tuner: ask for that plan.
  const PlanQuery q = planQuery(opt_.collective, l, type);
  char buf[128] = {};
  const weftMemory_t memory = gpu_ ? weftGpuMemory : weftHostMemory;
  if (Status s = opt_.compress ? checked(weftCommPlanEx(comm, q.coll, q.count, q.type, memory,
                                                        &*opt_.compress, buf, sizeof buf),
                                         "weftCommPlanEx")
                               : checked(weftCommPlanMemory(comm, q.coll, q.count, q.type, memory,
                                                            buf, sizeof buf),
                                         "weftCommPlanMemory");
      !s)
    return s;
  return std::string(buf);
}

bool RankBench::serves(std::size_t k, const std::string& plan) const {
  const ForcedAlgorithm& f = opt_.algos[k];
  const auto slash = plan.find('/');
  const std::string algorithm = plan.substr(0, slash);
  const std::string protocol = slash == std::string::npos ? "" : plan.substr(slash + 1);
  return algorithm == f.algorithm && (f.protocol.empty() || protocol == f.protocol);
}

Status RankBench::callAt(weftComm_t comm, const Layout& l, DataType type, RedOp op, int root,
                         bool inPlace, std::size_t shift) {
  // As nccl-tests: in place, rank r sends from and receives into the receive buffer at r times
  // the collective's stride (all-gather's input and reduce-scatter's output are r's block).
  const std::size_t e = sizeOf(type);
  const auto r = static_cast<std::size_t>(rank_);
  std::byte* recv = recvBuffer() + shift;
  const std::byte* send = inPlace ? recv + r * l.sendInPlaceStride * e : sendBuffer() + shift;
  std::byte* out = inPlace ? recv + r * l.recvInPlaceStride * e : recv;
  return launch(opt_.collective, comm, send, out, l, type, op, root, rank_, nranks_,
                gpu_ ? gpu_->stream() : nullptr, opt_.compress ? &*opt_.compress : nullptr);
}

Status RankBench::finishGpu(weftComm_t comm) {
  if (Status s = gpu_->synchronize(); !s) return s;
  return asyncError(comm);
}

Result<RankBench::Checked> RankBench::check(weftComm_t comm, const Layout& l, DataType type,
                                            std::optional<RedOp> op, int root, bool inPlace) {
  const Collective c = opt_.collective;
  const DataCheck data(type, op, nranks_, opt_.seed + 0x9e3779b97f4a7c15ull * ++checks_);
  const std::size_t e = sizeOf(type);
  std::byte* send = send_.get();
  std::byte* recv = recv_.get();
  const bool fills = fillsInput(c, rank_, root);
  // The elements of the receive buffer the run may write or is checked for.
  const std::size_t recvBytes = (inPlace ? std::max(l.sendCount, l.recvCount) : l.recvCount) * e;
  if (inPlace) {
    data.poison(recv, std::max(l.sendCount, l.recvCount));
    if (fills)
      data.fill(recv + static_cast<std::size_t>(rank_) * l.sendInPlaceStride * e, l.sendCount,
                rank_, 0);
  } else {
    if (fills) data.fill(send, l.sendCount, rank_, 0);
    data.poison(recv, l.recvCount);
  }
  // On GPU memory the data is made here and copied in; the result is copied out to be read.
  if (gpu_) {
    if (!inPlace && fills) {
      if (Status s = gpu_->copyIn(deviceSend_, send, l.sendCount * e); !s) return s;
    }
    if (Status s = gpu_->copyIn(deviceRecv_, recv, recvBytes); !s) return s;
  }
  // Every rank's buffers are ready before any rank's call could touch them.
  if (Status s = control_->barrier(); !s) return s;
  if (Status s = callAt(comm, l, type, op.value_or(RedOp::sum), root, inPlace, 0); !s) return s;
  if (gpu_) {
    if (Status s = finishGpu(comm); !s) return s;
    if (Status s = gpu_->copyOut(recv, deviceRecv_, recvBytes); !s) return s;
  }
  Checked result;
  std::int64_t wrong = 0;
  Deviation d;
  for (const Expect& x : expectations(c, l, rank_, nranks_, root, inPlace)) {
    if (opt_.compress) {
      d.add(data.deviation(recv, x));
    } else {
      wrong += data.wrong(recv, x);
    }
  }
  if (opt_.compress) {
    // Lossy: what is not finite is wrong; the deviation is reported (the largest over ranks,
    // and the ranks' mean).
    wrong = d.notFinite;
    auto most = control_->combine(d.maxRelative(), 3);
    if (!most) return most.status();
    auto mean = control_->combine(d.meanRelative(), 1);
    if (!mean) return mean.status();
    result.maxRel = *most;
    result.meanRel = *mean;
  }
  auto total = control_->sum(wrong);
  if (!total) return total.status();
  result.wrong = *total;
  return result;
}

Status RankBench::enqueueTimed(weftComm_t comm, const Layout& l, DataType type, RedOp op, int root,
                               bool inPlace) {
  const Rotation rotation = rotationFor(l.bytes(sizeOf(type)), opt_.maxBytes);
  const int agg = opt_.aggIters;
  for (int iter = 0; iter < opt_.iters; ++iter) {
    if (agg > 1) {
      if (Status s = checked(weftGroupStart(), "weftGroupStart"); !s) return s;
    }
    for (int a = 0; a < agg; ++a) {
      const auto i = static_cast<std::size_t>(iter * agg + a);
      if (Status s = callAt(comm, l, type, op, root, inPlace, rotation.at(i)); !s) return s;
    }
    if (agg > 1) {
      if (Status s = checked(weftGroupEnd(), "weftGroupEnd"); !s) return s;
    }
    if (opt_.blocking) {
      if (gpu_) {
        if (Status s = finishGpu(comm); !s) return s;
      }
      if (Status s = checked(weftBarrier(comm, nullptr), "weftBarrier"); !s) return s;
    }
  }
  return {};
}

Result<double> RankBench::timeOnGpu(weftComm_t comm, const Layout& l, DataType type, RedOp op,
                                    int root, bool inPlace) {
  if (Status s = finishGpu(comm); !s) return s;
  const bool graph = opt_.graphLaunches > 0;
  if (graph) {
    // -G: the timed calls become a graph, captured on this thread only (thread-local mode: the
    // other ranks' threads keep enqueueing their own calls), launched -G times below.
    if (Status s = gpu_->beginCapture(); !s) return s;
    const Status captured = enqueueTimed(comm, l, type, op, root, inPlace);
    const Status ended = gpu_->endCapture();  // even after a failed call: the stream leaves capture
    if (!captured) return captured;
    if (!ended) return ended;
  }
  // Every rank starts its timed calls together.
  if (Status s = control_->barrier(); !s) return s;
  const auto start = std::chrono::steady_clock::now();
  if (Status s = gpu_->recordStart(); !s) return s;
  for (int launch = 0; launch < std::max(1, opt_.graphLaunches); ++launch) {
    if (Status s = graph ? gpu_->launchGraph() : enqueueTimed(comm, l, type, op, root, inPlace); !s)
      return s;
  }
  if (Status s = gpu_->recordStop(); !s) return s;
  // -C: the host's time to enqueue the calls, as nccl-tests' cputime.
  const std::chrono::duration<double> enqueued = std::chrono::steady_clock::now() - start;
  if (Status s = finishGpu(comm); !s) return s;
  // Freed while no rank can be past the combine that follows, so no other rank's kernel waits
  // for this one's next call (freeing may wait for the whole device).
  gpu_->dropGraph();
  auto elapsed = gpu_->elapsedSeconds();
  if (!elapsed) return elapsed.status();
  const double calls =
      static_cast<double>(opt_.iters) * opt_.aggIters * std::max(1, opt_.graphLaunches);
  return (opt_.reportCpuTime ? enqueued.count() : *elapsed) / calls;
}

Result<Measurement> RankBench::measure(weftComm_t comm, const Layout& l, DataType type,
                                       std::optional<RedOp> op, int root, bool inPlace) {
  const RedOp redop = op.value_or(RedOp::sum);
  const std::size_t e = sizeOf(type);
  // One untimed call first: on GPU memory it copies this size's schedule to the device, which
  // must happen before a graph capture.
  if (Status s = callAt(comm, l, type, redop, root, inPlace, 0); !s) return s;
  double perCall = 0;
  if (gpu_) {
    auto t = timeOnGpu(comm, l, type, redop, root, inPlace);
    if (!t) return t.status();
    perCall = *t;
  } else {
    if (Status s = checked(weftBarrier(comm, nullptr), "weftBarrier"); !s) return s;
    const auto start = std::chrono::steady_clock::now();
    if (Status s = enqueueTimed(comm, l, type, redop, root, inPlace); !s) return s;
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    perCall = elapsed.count() / (opt_.iters * opt_.aggIters);
  }
  auto seconds = control_->combine(perCall, opt_.average);
  if (!seconds) return seconds.status();
  Measurement m;
  m.timeUs = *seconds * 1e6;
  if (*seconds > 0) {
    m.algBw = algBytes(opt_.collective, l, e, nranks_) / 1e9 / *seconds;
    m.busBw = m.algBw * busFactor(opt_.collective, nranks_);
  }
  if (opt_.checkIters > 0 && (!inPlace || checksInPlace(opt_.collective))) {
    Checked checked;
    for (int i = 0; i < opt_.checkIters && checked.wrong == 0; ++i) {
      auto c = check(comm, l, type, op, root, inPlace);
      if (!c) return c.status();
      checked = *c;
    }
    m.wrong = checked.wrong;
    if (checked.wrong > 0) exitCode_ = kExitFailed;
    m.maxRelError = checked.maxRel;
    m.meanRelError = checked.meanRel;
  }
  return m;
}

Status RankBench::runRow(std::size_t size, DataType type, std::optional<RedOp> op, int root) {
  const Layout l = layoutFor(opt_.collective, size, sizeOf(type), nranks_);
  Row row;
  row.collective = opt_.collective;
  row.bytes = l.bytes(sizeOf(type));
  row.count = l.count;
  row.type = type;
  row.op = op;
  row.root = root;
  auto plan = planOf(comm_->handle(), std::nullopt, l, type);
  if (!plan) return plan.status();
  row.plan = *plan;
  auto oop = measure(comm_->handle(), l, type, op, root, false);
  if (!oop) return oop.status();
  row.outOfPlace = *oop;
  auto ip = measure(comm_->handle(), l, type, op, root, true);
  if (!ip) return ip.status();
  row.inPlace = *ip;
  for (std::size_t k = 0; k < forced_.size(); ++k) {
    auto forcedPlan = planOf(forced_[k].handle(), k, l, type);
    if (!forcedPlan) return forcedPlan.status();
    ForcedResult f{*forcedPlan, std::nullopt};
    if (serves(k, f.plan)) {
      auto m = measure(forced_[k].handle(), l, type, op, root, false);
      if (!m) return m.status();
      f.outOfPlace = *m;
    }
    row.forced.push_back(std::move(f));
  }
  if (Peer* p = peer(); p != nullptr) {
    // The same call, buffers, slices and iteration count through the peer. Whether it can run
    // the call depends on the arguments alone, so every rank takes the same branch.
    auto seconds =
        p->secondsPerCall(opt_.collective, l, type, op.value_or(RedOp::sum), root, sendBuffer(),
                          recvBuffer(), rotationFor(l.bytes(sizeOf(type)), opt_.maxBytes), 1,
                          opt_.iters * opt_.aggIters, opt_.graphLaunches);
    if (seconds) {
      auto combined = control_->combine(*seconds, opt_.average);
      if (!combined) return combined.status();
      row.peerTimeUs = *combined * 1e6;
    }
  }
  if (report_) report_->add(std::move(row));
  return {};
}

Status RankBench::warmUp(weftComm_t comm, std::optional<std::size_t> forced, DataType type,
                         RedOp op, int root) {
  // As nccl-tests: out-of-place calls at the largest size, then at the smallest.
  for (std::size_t size : {opt_.maxBytes, opt_.minBytes}) {
    const Layout l = layoutFor(opt_.collective, size, sizeOf(type), nranks_);
    if (forced) {
      auto plan = planOf(comm, forced, l, type);
      if (!plan) return plan.status();
      if (!serves(*forced, *plan)) continue;
    }
    for (int i = 0; i < opt_.warmupIters; ++i) {
      if (Status s = callAt(comm, l, type, op, root, false, 0); !s) return s;
    }
  }
  return {};
}

Status RankBench::sweep(DataType type, std::optional<RedOp> op, int root) {
  // Valid inputs everywhere, in both buffers (in place, the receive buffer is the input), so
  // that no timed reduction runs on poison or on denormals.
  const DataCheck timingData(type, op, nranks_, opt_.seed);
  const std::size_t elements = bufferBytes_ / sizeOf(type);
  timingData.fill(send_.get(), elements, rank_, 0);
  timingData.fill(recv_.get(), elements, rank_, 0);
  if (gpu_) {
    if (Status s = gpu_->copyIn(deviceSend_, send_.get(), bufferBytes_); !s) return s;
    if (Status s = gpu_->copyIn(deviceRecv_, recv_.get(), bufferBytes_); !s) return s;
  }
  const RedOp redop = op.value_or(RedOp::sum);
  if (Status s = warmUp(comm_->handle(), std::nullopt, type, redop, root); !s) return s;
  for (std::size_t k = 0; k < forced_.size(); ++k) {
    if (Status s = warmUp(forced_[k].handle(), k, type, redop, root); !s) return s;
  }
  const std::vector<std::size_t> sizes = sweepSizes(opt_);
  for (int cycle = 0; opt_.runCycles == 0 || cycle < opt_.runCycles; ++cycle) {
    for (std::size_t size : sizes) {
      if (Status s = runRow(size, type, op, root); !s) return s;
    }
  }
  return {};
}

Status RankBench::run() {
  if (Status s = join(); !s) return s;
  if (Status s = joinPeer(); !s) return s;
  if (Status s = preamble(); !s) return s;
  if (!opt_.calibratePath.empty()) {
    calibration_ = std::make_unique<Calibration>(ctx_, thread_, *comm_, *control_, gpu_.get());
    bool quietFailure = false;  // rank 0 says why
    Status s = calibration_->run(quietFailure);
    if (quietFailure) exitCode_ = kExitFailed;  // rank 0 says why, and exits as it must
    return s;
  }
  if (opt_.tp != TpMode::none)
    return runTpBench(ctx_, thread_, *comm_, *control_, gpu_.get(), exitCode_);
  if (opt_.attention)
    return runAttentionBench(ctx_, thread_, *comm_, *control_, gpu_.get(), exitCode_);
  if (opt_.moe) return runMoeBench(ctx_, thread_, *comm_, *control_, gpu_.get(), exitCode_);
  if (Status s = joinForced(); !s) return s;
  if (Status s = registerBuffers(); !s) return s;
  if (report_) report_->printHeader();
  std::vector<std::optional<RedOp>> ops;
  if (isReduction(opt_.collective)) {
    for (RedOp op : opt_.ops) ops.push_back(op);
  } else {
    ops.push_back(std::nullopt);
  }
  std::vector<int> roots;
  if (!hasRoot(opt_.collective)) {
    roots.push_back(-1);
  } else if (opt_.root >= 0) {
    roots.push_back(opt_.root);
  } else {
    for (int r = 0; r < nranks_; ++r) roots.push_back(r);
  }
  for (DataType type : opt_.types) {
    for (const auto& op : ops) {
      for (int root : roots) {
        if (Status s = sweep(type, op, root); !s) return s;
      }
    }
  }
  if (report_ && !report_->finish() && exitCode_ == kExitOk) exitCode_ = kExitFailed;
  return {};
}

void RankBench::abort() {
  if (comm_) (void)comm_->abort();
  for (Comm& c : forced_) (void)c.abort();
  if (calibration_) calibration_->abort();
}

}  // namespace

int runRank(ProcessContext& context, int thread) {
  RankBench bench(context, thread);
  Status s = bench.run();
  // A rank that stops early must not leave this process's other ranks at a barrier.
  context.threads->arrive_and_drop();
  if (!s) {
    std::fprintf(stderr, "weft-perf: rank %d: %s\n",
                 context.proc * context.options.threads + thread, s.toString().c_str());
    // The other ranks' calls end with an error instead of waiting for the timeout.
    bench.abort();
    context.callFailed = true;
    return s.code() == Code::invalidArgument ? kExitUsage : kExitFailed;
  }
  return bench.exitCode();
}

}  // namespace weft::perf
