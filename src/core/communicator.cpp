#include "src/core/communicator.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "algorithms/algorithm.hpp"
#include "src/core/arguments.hpp"
#include "src/core/sizes.hpp"
#include "src/exec/host_reduce.hpp"
#include "src/transport/cuda_ipc.hpp"

namespace weft {
namespace {

// What each rank tells the others about itself at init: first where it runs and how it is set
// up, then (once every pair's transport is known) how to reach it.
struct HostRecord {
  char hostname[64];
  std::uint64_t hostId;  // hostname and boot id: ranks with equal ids share memory
  std::int32_t pid;
  std::int32_t channels, slots;
  char transport[8];
  std::uint64_t slotBytes;
};
struct ReachRecord {
  char inbox[96];
  std::uint64_t inboxBytes;
  std::uint64_t ucxBytes;                  // this rank's UCX address record (0 without UCX peers)
  std::uint64_t probeAddress, probeValue;  // a word peers try to read (single copy)
};

// The cores this rank may use: those it is bound to, and no more than its share of the host's
// (0 where the ranks outnumber the cores).
long coresOfThisRankOrNone(int ranksOnHost) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const long bound = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : online;
  return std::min(bound, online / std::max(1, ranksOnHost));
}
int coresOfThisRank(int ranksOnHost) {
  return static_cast<int>(std::max(1L, coresOfThisRankOrNone(ranksOnHost)));
}

// Where every rank has a core for each of its threads, waits spin this long before they nap and
// channel workers this long for their next job (Communicator::create says why).
constexpr std::chrono::microseconds kLongSpin{1000};
constexpr std::chrono::microseconds kWorkerSpin{200};

// A point-to-point message that names the sender's buffer instead of carrying it.
constexpr std::uint64_t kSingleCopyMagic = 0x57454654'53494e47ull;
struct SingleCopy {
  std::uint64_t magic;
  std::uintptr_t address;
  std::uint64_t bytes;
};

// The first to claim an inbox's flag writes the reason, then publishes it with a release store;
// a waiter's acquire load of the flag sees the text.
void raiseAbort(std::byte* inbox, const std::string& why) {
  transport::ShmControl* c = transport::controlOf(inbox);
  int expected = 0;
  if (c->claimed.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    std::snprintf(c->reason, sizeof c->reason, "%s", why.c_str());
    c->aborted.store(1, std::memory_order_release);
  }
}

bool processAlive(int pid) {
  return pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH;
}

// The host's name and an id that differs between machines (and containers) that share a name.
void describeHost(HostRecord& r, const std::string& testHostId) {
  if (gethostname(r.hostname, sizeof r.hostname) != 0) std::snprintf(r.hostname, 8, "unknown");
  r.hostname[sizeof r.hostname - 1] = '\0';
  if (!testHostId.empty()) {
    std::snprintf(r.hostname, sizeof r.hostname, "test-host-%s", testHostId.c_str());
  }
  char line[64] = {};  // the file closed before anything allocates (and may throw)
  if (std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    if (std::fgets(line, sizeof line, f) == nullptr) line[0] = '\0';
    std::fclose(f);
  }
  const std::string boot = line;
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char ch : std::string(r.hostname) + "/" + boot) {
    h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  }
  r.hostId = h;
}

}  // namespace

ChannelWorkers::ChannelWorkers(int workers, std::chrono::microseconds spin) : spin_(spin) {
  try {
    for (int i = 0; i < workers; ++i) threads_.emplace_back(&ChannelWorkers::loop, this, i + 1);
  } catch (...) {
    stop();  // the ones started, before the exception (std::system_error) leaves
    throw;
  }
}

ChannelWorkers::~ChannelWorkers() {
  stop();
}

void ChannelWorkers::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true, std::memory_order_relaxed);
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

namespace {

// Spins until done() holds or `limit` has passed; returns done().
template <typename Done>
bool spinFor(std::chrono::microseconds limit, Done&& done) {
  if (limit.count() <= 0) return done();
  const auto until = std::chrono::steady_clock::now() + limit;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (i % 64 == 63 && std::chrono::steady_clock::now() > until) return done();
    transport::Waiter::relax();
  }
}

}  // namespace

void ChannelWorkers::run(std::size_t channels, const std::function<void(std::size_t)>& fn) {
  if (channels <= 1) {
    // One channel runs on the caller alone: waking the workers would cost more than a small
    // call's whole exchange.
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    channels_ = channels;
    pending_.store(channels - 1, std::memory_order_relaxed);
    round_.fetch_add(1, std::memory_order_release);
  }
  start_.notify_all();
  fn(0);
  if (spinFor(spin_, [&] { return pending_.load(std::memory_order_acquire) == 0; })) return;
  std::unique_lock<std::mutex> lock(mutex_);
  finished_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
}

void ChannelWorkers::loop(std::size_t channel) {
  std::uint64_t seen = 0;
  for (;;) {
    spinFor(spin_, [&] {
      return round_.load(std::memory_order_acquire) != seen ||
             stop_.load(std::memory_order_relaxed);
    });
    std::unique_lock<std::mutex> lock(mutex_);
    start_.wait(lock, [&] {
      return stop_.load(std::memory_order_relaxed) ||
             round_.load(std::memory_order_relaxed) != seen;
    });
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = round_.load(std::memory_order_relaxed);
    if (channel >= channels_) continue;
    const std::function<void(std::size_t)>* job = job_;
    lock.unlock();
    (*job)(channel);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> done(mutex_);
      finished_.notify_one();
    }
  }
}

Result<std::unique_ptr<Communicator>> Communicator::create(
    std::unique_ptr<boot::Bootstrap> bootstrap, const Config& config) {
  std::unique_ptr<Communicator> c(new Communicator());
  c->config_ = config;
  c->rank_ = bootstrap->rank();
  c->size_ = bootstrap->size();
  c->bootstrap_ = std::move(bootstrap);
  const int n = c->size_, me = c->rank_;
  const auto N = static_cast<std::size_t>(n), ME = static_cast<std::size_t>(me);

  c->geometry_.nranks = n;
  c->geometry_.channels = std::clamp(config.maxChannels, 2, 16);  // the double binary tree needs 2
  c->geometry_.slots = std::clamp(config.fifoSlots, 2, 64);
  c->geometry_.slotBytes = config.fifoSlotBytes;

  // 1. Where every rank runs, and whether the ranks agree on the set-up.
  std::vector<HostRecord> hosts(N);
  HostRecord& self = hosts[ME];
  describeHost(self, config.testHostId);
  self.pid = getpid();
  self.channels = c->geometry_.channels;
  self.slots = c->geometry_.slots;
  self.slotBytes = c->geometry_.slotBytes;
  std::snprintf(self.transport, sizeof self.transport, "%s", config.transport.c_str());
  if (Status s = c->bootstrap_->allGather(hosts.data(), sizeof(HostRecord)); !s) return s;
  c->pids_.resize(N);
  c->sendsTo_.assign(N, 0);
  c->recvsFrom_.assign(N, 0);
  c->sameHost_.resize(N);
  c->viaUcx_.assign(N, false);
  bool anyUcx = false;
  for (std::size_t q = 0; q < N; ++q) {
    const HostRecord& r = hosts[q];
    c->pids_[q] = r.pid;
    if (r.channels != self.channels || r.slots != self.slots || r.slotBytes != self.slotBytes ||
        std::strcmp(r.transport, self.transport) != 0) {
      return Status(Code::invalidUsage,
                    "rank " + std::to_string(me) + ": rank " + std::to_string(q) +
                        " is set up differently (WEFT_MAX_CHANNELS, WEFT_SLOT_BYTES and "
                        "WEFT_TRANSPORT must be the same on every rank)");
    }
    c->sameHost_[q] = r.hostId == self.hostId;
    for (std::size_t p = 0; p < N; ++p) {
      // Every rank decides every pair the same way, so all agree on whether UCX is needed.
      const bool ucx = p != q && (config.transport == "ucx" || hosts[p].hostId != r.hostId);
      anyUcx = anyUcx || ucx;
      if (q == ME && ucx) c->viaUcx_[p] = true;
    }
    if (!c->sameHost_[q] && config.transport == "shm") {
      return Status(Code::invalidUsage,
                    "rank " + std::to_string(me) + " (on " + self.hostname + "): rank " +
                        std::to_string(q) + " runs on " + r.hostname +
                        ", but WEFT_TRANSPORT=shm needs every rank on one host (use auto or ucx)");
    }
  }
  // The machine: one host topology for every rank, and which host each rank is on.
  std::vector<std::uint64_t> hostIds;
  for (const HostRecord& r : hosts) hostIds.push_back(r.hostId);
  auto machine = Machine::agree(*c->bootstrap_, config.topoFile, hostIds);
  if (!machine) return machine.status();
  c->machine_ = std::move(*machine);
  if (anyUcx && !transport::ucxAvailable()) {
    return Status(Code::unsupported,
                  "rank " + std::to_string(me) +
                      ": the ranks span several hosts (or "
                      "WEFT_TRANSPORT=ucx), but this build has no UCX transport (build with "
                      "libucx-dev)");
  }
  const bool anyShm = [&] {
    for (std::size_t q = 0; q < N; ++q) {
      if (q != ME && c->sameHost_[q] && !c->viaUcx_[q]) return true;
    }
    return false;
  }();

  // The direct path needs every rank on this host, through shared memory; ranks in several
  // processes go through their inboxes' stages, threads of one process load from each other.
  c->directThreads_ =
      std::all_of(c->pids_.begin(), c->pids_.end(), [&](int pid) { return pid == c->pids_[ME]; });
  c->directPossible_ = n >= 2 && config.hostDirect != 0 && !anyUcx;

  // 2. This rank's inbox (FIFOs when a peer on this host uses them; else the control page
  // that carries aborts between ranks of one host) and its UCX workers.
  c->geometry_.fifos = anyShm;
  if (c->directPossible_ && !c->directThreads_) {
    // A round of an all-reduce takes at least a cache line from every rank and one sum.
    c->geometry_.stageBytes =
        std::max(config.hostStageBytes, roundUp(2 * (N + 1) * std::size_t{64}, 8192));
  }
  auto inbox = transport::ShmSegment::create(c->geometry_.inboxBytes());
  if (!inbox) return inbox.status();
  c->inbox_ = std::move(*inbox);
  transport::initInbox(c->inbox_.data(), c->geometry_);
  c->abortFlag_ = &transport::controlOf(c->inbox_.data())->aborted;
  const bool myUcx = std::find(c->viaUcx_.begin(), c->viaUcx_.end(), true) != c->viaUcx_.end();
  if (myUcx) {
    transport::UcxGeometry ug;
    ug.nranks = n;
    ug.rank = me;
    ug.channels = c->geometry_.channels;
    ug.slots = c->geometry_.slots;
    ug.slotBytes = c->geometry_.slotBytes;
    auto ucx = transport::UcxTransport::create(ug);
    if (!ucx) return ucx.status();
    c->ucx_ = std::move(*ucx);
    c->ucx_->callNamer = [raw = c.get()] { return raw->current_.toString(); };
  }

  // 3. How to reach every rank.
  std::vector<ReachRecord> reach(N);
  std::snprintf(reach[ME].inbox, sizeof reach[ME].inbox, "%s", c->inbox_.name().c_str());
  reach[ME].inboxBytes = c->geometry_.inboxBytes();
  reach[ME].ucxBytes = c->ucx_ ? c->ucx_->address().size() : 0;
  // One word per process, never freed: a peer thread may still read it after this rank's init
  // failed and its communicator went (in-process ranks read each other with memcpy).
  static const std::uint64_t* const probe =
      new std::uint64_t(0x77656674'00000000ull ^ (static_cast<std::uint64_t>(getpid()) << 8));
  reach[ME].probeAddress = reinterpret_cast<std::uintptr_t>(probe);
  reach[ME].probeValue = *probe;
  if (Status s = c->bootstrap_->allGather(reach.data(), sizeof(ReachRecord)); !s) return s;
  std::size_t ucxBytes = 0;
  for (const ReachRecord& r : reach) ucxBytes = std::max<std::size_t>(ucxBytes, r.ucxBytes);
  std::vector<std::vector<std::byte>> addresses(N);
  if (ucxBytes > 0) {
    std::vector<std::byte> all(N * ucxBytes);
    if (c->ucx_) std::memcpy(&all[ME * ucxBytes], c->ucx_->address().data(), reach[ME].ucxBytes);
    if (Status s = c->bootstrap_->allGather(all.data(), ucxBytes); !s) return s;
    for (std::size_t q = 0; q < N; ++q) {
      addresses[q].assign(
          all.begin() + static_cast<std::ptrdiff_t>(q * ucxBytes),
          all.begin() + static_cast<std::ptrdiff_t>(q * ucxBytes + reach[q].ucxBytes));
    }
  }
  c->peerInboxes_.resize(N);
  for (std::size_t q = 0; q < N; ++q) {
    if (q == ME || !c->sameHost_[q]) continue;
    auto seg = transport::ShmSegment::open(reach[q].inbox, reach[q].inboxBytes);
    if (!seg) return seg.status();
    c->peerInboxes_[q] = std::move(*seg);
  }
  if (c->ucx_) {
    if (Status s = c->ucx_->connect(addresses, c->viaUcx_, c->sameHost_); !s) return s;
  }
  // Single copy between shared-memory peers: can this rank read each one's memory? (The
  // kernel may forbid process_vm_readv: Yama's ptrace scope, seccomp.) Probe each peer's probe
  // word, then share the answers, so a sender knows whether its receiver reads it.
  c->peerMemory_.resize(N);
  c->iRead_.assign(N, 0);
  c->readsMe_.assign(N, 0);
  for (std::size_t q = 0; q < N; ++q) {
    if (q == ME || c->viaUcx_[q]) continue;
    c->peerMemory_[q] = transport::PeerMemory(c->pids_[q]);
    std::uint64_t seen = 0;
    if (c->peerMemory_[q].read(&seen, reach[q].probeAddress, sizeof seen) &&
        seen == reach[q].probeValue)
      c->iRead_[q] = 1;
  }
  std::vector<std::uint8_t> canRead(N * N);
  std::copy(c->iRead_.begin(), c->iRead_.end(),
            canRead.begin() + static_cast<std::ptrdiff_t>(ME * N));
  if (Status s = c->bootstrap_->allGather(canRead.data(), N); !s) return s;
  for (std::size_t q = 0; q < N; ++q) c->readsMe_[q] = canRead[q * N + ME];
  c->readRate_ = std::make_unique<transport::ReadRate>(
      &transport::controlOf(c->inbox_.data())->refusesReferences, config.singleCopyMinGBps);
  if (!config.debug.empty()) {
    c->readRate_->onRefuse([me](double gbps) {
      std::fprintf(stderr,
                   "weft WARN rank %d: reading peers' buffers ran at %.2f GB/s "
                   "(process_vm_readv, below WEFT_SINGLE_COPY_MIN_GBPS): its peers send it "
                   "bytes through the FIFO from now on\n",
                   me, gbps);
    });
  }
  c->refuses_.assign(N, nullptr);
  for (std::size_t q = 0; q < N; ++q) {
    if (q != ME && c->sameHost_[q] && !c->viaUcx_[q])
      c->refuses_[q] = &transport::controlOf(c->peerInboxes_[q].data())->refusesReferences;
  }
  // A rank's cores: the direct path's threads take no more (below). Between processes the
  // automatic choice wants two on every rank: with one each (mpirun --bind-to core), 8 ranks of
  // the H200 machine's host ran all-reduces of 1-64 MB through the stages 7-37 % slower than
  // through the FIFOs; with two (--map-by slot:PE=2) even to 2.1x faster (docs/perf.md). Among
  // threads one core was enough (2 ranks on the VM: 1.1-2.3x faster).
  const int ranksHere =
      static_cast<int>(std::count(c->sameHost_.begin(), c->sameHost_.end(), true));
  const int cores = coresOfThisRank(ranksHere);
  if (c->directPossible_ && !c->directThreads_ && config.hostDirect < 0) {
    std::vector<std::int32_t> all(N);
    all[ME] = cores;
    if (Status s = c->bootstrap_->allGather(all.data(), sizeof(std::int32_t)); !s) return s;
    c->directFewestCores_ = *std::min_element(all.begin(), all.end());
    c->directPossible_ = c->directFewestCores_ >= 2;
  }
  // Everyone has mapped everyone's inbox: the names can go, so nothing outlives the processes.
  if (Status s = c->bootstrap_->barrier(); !s) return s;
  c->inbox_.unlink();

  c->links_.resize(static_cast<std::size_t>(c->geometry_.channels));
  for (int ch = 0; ch < c->geometry_.channels; ++ch) {
    exec::ChannelLinks& l = c->links_[static_cast<std::size_t>(ch)];
    l.memory = &c->peerMemory_;
    l.readsMe = &c->readsMe_;
    l.reads = c->readRate_.get();
    l.refuses = &c->refuses_;
    l.to.assign(N, nullptr);
    l.from.assign(N, nullptr);
    for (int q = 0; q < n; ++q) {
      const auto Q = static_cast<std::size_t>(q);
      if (q == me) continue;
      if (c->viaUcx_[Q]) {
        l.to[Q] = c->ucx_->to(ch, q);
        l.from[Q] = c->ucx_->from(ch, q);
        continue;
      }
      std::byte* peerInbox = c->peerInboxes_[Q].data();
      c->connections_.push_back(std::make_unique<transport::ShmConnection>(
          peerInbox + c->geometry_.offset(ch, me), c->geometry_, q));
      l.to[Q] = c->connections_.back().get();
      c->connections_.push_back(std::make_unique<transport::ShmConnection>(
          c->inbox_.data() + c->geometry_.offset(ch, q), c->geometry_, q));
      l.from[Q] = c->connections_.back().get();
      if (c->ucx_) {
        // Waits on this host's peers keep the channel's UCX traffic moving.
        transport::UcxTransport* ucx = c->ucx_.get();
        for (transport::Connection** end : {&l.to[Q], &l.from[Q]}) {
          c->progressing_.push_back(std::make_unique<transport::ProgressingConnection>(
              *end, q, [ucx, ch] { ucx->progress(ch); }));
          *end = c->progressing_.back().get();
        }
      }
    }
  }
  // A peer on this host has failed when its process is gone; any UCX peer when its endpoint
  // reports an error.
  c->waiter_ = std::make_unique<transport::Waiter>(
      c->abortFlag_, transport::controlOf(c->inbox_.data())->reason,
      [pids = c->pids_, same = c->sameHost_, ucx = c->ucx_.get(),
       inbox = c->inbox_.data()](int q) -> std::string {
        const auto Q = static_cast<std::size_t>(q);
        if (ucx != nullptr) {
          // A rank on another host aborted: this rank's later calls fail as after abort().
          if (std::string why = ucx->pollAbort(); !why.empty()) {
            raiseAbort(inbox, why);
            return "the communicator was aborted (" + why + ")";
          }
        }
        if (same[Q] && !processAlive(pids[Q])) return "that rank's process has exited";
        if (ucx != nullptr) return ucx->peerFailure(q);
        return {};
      },
      config.timeout, me);
  if (config.checkCalls) c->waiter_->watchWith([raw = c.get()] { raw->watchCall(); });
  // A rank with one core (or less) runs a schedule's channels one after another on the calling
  // thread: on threads they only take turns on that core, and every handover costs a wakeup (2
  // ranks of one core on the 2-core VM, all-gather of 2 MB on its two channels: 140-380 us on
  // threads, against 55-60 for 1 MB on one; docs/perf.md). Every channel's traffic stays in its
  // own FIFOs and its own part of the buffers, so one channel finishing before the next starts
  // is a schedule every peer can meet.
  c->channelsInline_ = config.hostChannelThreads == 0 ||
                       (config.hostChannelThreads < 0 && coresOfThisRankOrNone(ranksHere) <= 1);
  // Where each of the rank's threads has a core, waits spin longer before they nap, and the
  // channel workers spin for their next job before they sleep: on the H200 machine's host (8
  // ranks of 2 cores) the direct path's 1 MB all-reduce ran in 326-358 us so, and in 393-1015
  // with the short spin and the workers asleep between calls. A rank whose channels run on its
  // caller has one thread: one core is enough (2 ranks of one core on the 2-core VM, a 1 MB
  // send/recv whose receiver reads it in one process_vm_readv of ~85 us: the sender's nap
  // overslept that by ~100 us, docs/perf.md).
  const int threads = c->channelsInline_ ? 1 : c->geometry_.channels;
  const bool spins = coresOfThisRankOrNone(ranksHere) >= threads;
  if (spins) c->waiter_->spinFor(kLongSpin);
  // Where the ranks outnumber the host's cores, a spinning wait holds the core its peer needs:
  // waits yield it instead (4 processes on the 2-core VM: all-reduce 8 B 265 -> 11.7 us, 2 MB
  // 3.3 -> 1.0 ms, 16 MB 21.7 -> 8.2 ms). Not where each rank has a core and only its channel
  // threads outnumber them (2 ranks there: no faster, and 0.5 -> 1.3 us at 8 B).
  if (coresOfThisRankOrNone(ranksHere) == 0) c->waiter_->yieldWhileSpinning(true);
  c->workers_ = std::make_unique<ChannelWorkers>(
      c->geometry_.channels - 1, spins ? kWorkerSpin : std::chrono::microseconds(0));
  c->slotsPossible_ =
      n >= 2 && std::none_of(c->viaUcx_.begin(), c->viaUcx_.end(), [](bool ucx) { return ucx; });
  if (c->slotsPossible_) {
    exec::SlotsGroup& g = c->slotsGroup_;
    g.rank = me;
    g.nranks = n;
    for (std::size_t q = 0; q < N; ++q) {
      std::byte* of = q == ME ? c->inbox_.data() : c->peerInboxes_[q].data();
      g.slots.push_back(transport::smallSlotsOf(of));
    }
    g.waiter = c->waiter_.get();
  }
  if (c->directPossible_) {
    exec::DirectGroup& g = c->directGroup_;
    g.rank = me;
    g.nranks = n;
    for (std::size_t q = 0; q < N; ++q) {
      g.controls.push_back(
          transport::controlOf(q == ME ? c->inbox_.data() : c->peerInboxes_[q].data()));
    }
    if (!c->directThreads_) {
      for (std::size_t q = 0; q < N; ++q) {
        std::byte* of = q == ME ? c->inbox_.data() : c->peerInboxes_[q].data();
        g.stages.push_back(of + c->geometry_.stageOffset());
      }
      g.stageBytes = c->geometry_.stageBytes;
      g.pids = c->pids_;
    }
    g.waiter = c->waiter_.get();
    g.parallel = [workers = c->workers_.get()](std::size_t k,
                                               const std::function<void(std::size_t)>& fn) {
      workers->run(k, fn);
    };
    // Threads beyond the cores a rank has only take turns with its peers: a spinning barrier
    // holds a core while the thread it waits for waits for one (two ranks of two threads each
    // on two cores ran three times slower than with one thread each).
    g.threads = static_cast<std::size_t>(std::min(
        c->geometry_.channels, config.hostDirectThreads > 0 ? config.hostDirectThreads : cores));
    g.fixedThreads = config.hostDirectThreads > 0;
  }
  {
    // The host's candidates besides schedules: the slots and the direct path, where every rank
    // can take them (decided alike on every rank).
    algo::KernelSet k;
    for (Collective coll : {Collective::allReduce, Collective::allGather, Collective::reduceScatter,
                            Collective::broadcast, Collective::reduce, Collective::allToAll}) {
      const auto i = static_cast<std::size_t>(coll);
      k.slots[i] = c->slotsPossible_ && exec::slotsServe(coll);
      k.direct[i] = c->directPossible_ && exec::directServes(coll);
    }
    k.slotsMaxBytes = config.hostSmallBytes;
    k.directMinBytes = config.hostDirectBytes;
    c->selector_ = std::make_unique<algo::Selector>(c->machine_.hostGraph(), config.tuner, k);
    if ((config.debug == "INFO" || config.debug == "TRACE") && me == 0)
      std::fprintf(stderr, "weft INFO host calls priced on %d host(s) of %d rank(s) at most\n",
                   c->selector_->tuner().graph().hosts, c->selector_->tuner().graph().ranksPerHost);
  }
  c->created_ = true;
  return c;
}

Communicator::~Communicator() {
  // A rank whose set-up failed (an error or an exception out of create) tells its peers through
  // the bootstrap, so they fail now rather than at their timeout.
  if (!created_ && bootstrap_) bootstrap_->abort();
  // Registered buffers are unmapped before the executor goes: no kernel may still read them.
  if (gpu_ && !registrations_.empty()) (void)gpu_->synchronize();
}

Result<std::unique_ptr<Communicator>> Communicator::split(int color, int key) {
  if (Status s = checkUsable("split"); !s) return s;
  struct Entry {
    std::int32_t color, key, rank;
    boot::UniqueId id;  // filled by each color's leader: the rendezvous of the new communicator
  };
  std::vector<Entry> all(static_cast<std::size_t>(size_));
  all[static_cast<std::size_t>(rank_)] = {color, key, rank_, {}};
  if (Status s = bootstrap_->allGather(all.data(), sizeof(Entry)); !s) return fail(s);
  std::vector<Entry> members;
  for (const Entry& e : all) {
    if (color >= 0 && e.color == color) members.push_back(e);
  }
  std::sort(members.begin(), members.end(), [](const Entry& a, const Entry& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  const bool leader = !members.empty() && members.front().rank == rank_;
  // The leaders open their rendezvous; a second exchange hands every member its leader's id.
  boot::BootstrapOptions options;
  options.timeoutSeconds = static_cast<double>(config_.timeout.count()) / 1000.0;
  options.ifname = config_.socketIfname;
  if (leader) {
    auto id = boot::createUniqueId(options);
    if (!id) return id.status();
    all[static_cast<std::size_t>(rank_)].id = *id;
  }
  if (Status s = bootstrap_->allGather(all.data(), sizeof(Entry)); !s) return fail(s);
  if (color < 0) return std::unique_ptr<Communicator>();
  int newRank = 0;
  while (members[static_cast<std::size_t>(newRank)].rank != rank_) ++newRank;
  const boot::UniqueId id = all[static_cast<std::size_t>(members.front().rank)].id;
  auto boot = boot::connectTcp(id, newRank, static_cast<int>(members.size()), options, false);
  if (!boot) return boot.status();
  return create(std::move(*boot), config_);
}

std::string Communicator::summary() const {
  const bool ucx = ucx_ != nullptr;
  const bool shm = !connections_.empty();
  const std::string transports = ucx && shm ? "shm within a host, ucx between hosts"
                                 : ucx      ? "ucx transport"
                                            : "shm transport";
  std::string line = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                     ", host memory, " + transports + ", " + std::to_string(geometry_.channels) +
                     " channel(s), " + std::to_string(geometry_.slots) + " x " +
                     std::to_string(geometry_.slotBytes / 1024) + " KiB FIFO slots";
  const bool reads = std::find(iRead_.begin(), iRead_.end(), 1) != iRead_.end();
  if (reads && config_.singleCopyBytes > 0) {
    line += ", single copy from " + std::to_string(config_.singleCopyBytes / 1024) + " KiB";
  }
  const std::size_t directFrom =
      config_.hostDirectBytes.value_or(selector_->constants().hostDirectMinBytes);
  if (directPossible_ && directFrom > 0) {
    line += ", direct path from " + std::to_string(directFrom / 1024) + " KiB";
    if (!directThreads_)
      line += " through " + std::to_string(geometry_.stageBytes / 1024) + " KiB stages";
  } else if (directFewestCores_ > 0) {
    line += ", no direct path (a rank has " + std::to_string(directFewestCores_) +
            " core; WEFT_HOST_DIRECT=1 forces it)";
  }
  if (gpu_) line += "; GPU memory: " + gpu_->describe();
  return line;
}

void Communicator::abort(const std::string& why) {
  // Tell every rank: their waits watch their own inbox's flag, which ranks of this host set
  // directly; ranks on other hosts hear it through UCX's control worker.
  for (int q = 0; q < size_; ++q) {
    std::byte* inbox =
        q == rank_ ? inbox_.data() : peerInboxes_[static_cast<std::size_t>(q)].data();
    if (inbox != nullptr) raiseAbort(inbox, why);
  }
  if (ucx_) ucx_->notifyAbort(why);
  if (bootstrap_) bootstrap_->abort();
}

bool Communicator::aborted() const {
  return abortFlag_ != nullptr && abortFlag_->load(std::memory_order_acquire) != 0;
}

Status Communicator::checkUsable(const char* what) const {
  if (aborted()) {
    return {Code::invalidUsage, std::string(what) + ": the communicator was aborted (" +
                                    transport::controlOf(inbox_.data())->reason +
                                    "); destroy it and create a new one"};
  }
  return {};
}

Status Communicator::fail(Status s) {
  // A rank that saw a peer fail or time out stops the others instead of leaving them to time out.
  if (!s.isOk() && s.code() != Code::invalidArgument) abort(s.message());
  return s;
}

Result<algo::Plan> Communicator::planFor(Collective coll, std::size_t bytes) {
  const auto key = std::make_pair(static_cast<int>(coll), bytes);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  auto plan = selector_->plan(coll, bytes);
  if (plan && plan->kernel == algo::Kernel::hostDirect) plan->channels = geometry_.channels;
  if (plan) plans_.emplace(key, *plan);
  return plan;
}

Result<const Communicator::Cached*> Communicator::scheduleFor(Collective coll,
                                                              const algo::Plan& plan, int root,
                                                              int maxChannels) {
  const auto key = std::make_tuple(static_cast<int>(coll), plan.algorithm, plan.channels,
                                   plan.aggregation, root, maxChannels);
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second.get();
  const algo::Algorithm* a = algo::findAlgorithm(plan.algorithm);
  if (a == nullptr) return internalError("the tuner picked an unknown algorithm " + plan.algorithm);
  algo::Params params;
  params.root = root;
  params.aggregation = plan.aggregation;
  params.groupSize = size_;
  params.channels = 1;
  auto built = a->build(coll, size_, params);
  if (!built) return built.status();
  // Every schedule channel needs its own connections. Some generators already make several (the
  // double binary tree: one per tree), so the plan's count is cut to what the FIFOs provide.
  const int base = static_cast<int>(built->channels.size());
  if (base > maxChannels) {
    return Status(Code::invalidUsage, plan.algorithm + " needs " + std::to_string(base) +
                                          " channels; WEFT_MAX_CHANNELS (WEFT_GPU_CHANNELS on "
                                          "GPU buffers) allows " +
                                          std::to_string(maxChannels));
  }
  const int channels = std::clamp(plan.channels, 1, maxChannels / base);
  if (channels > 1) {
    params.channels = channels;
    built = a->build(coll, size_, params);
    if (!built) return built.status();
  }
  auto cached = std::make_unique<Cached>();
  cached->maxBlocks = exec::maxStepBlocks(*built);
  cached->byReference = exec::referenceSteps(*built);
  cached->schedule = std::move(*built);
  const Cached* out = cached.get();
  schedules_.emplace(key, std::move(cached));
  return out;
}

Status Communicator::run(Collective coll, const void* input, void* output, std::size_t count,
                         DataType type, RedOp op, int root, void* stream) {
  if (Status s = checkUsable(std::string(name(coll)).c_str()); !s) return s;
  if (count == 0) return {};
  if (exec::isDevicePointer(input) || exec::isDevicePointer(output))
    return runGpu(coll, input, output, count, type, op, root, stream);
  if (stream != nullptr) {
    return Status(Code::invalidUsage, std::string(name(coll)) +
                                          ": a stream was given with host buffers (streams "
                                          "order calls on GPU buffers; pass NULL)");
  }
  const algo::Segments seg = algo::segments(coll, size_);
  const std::size_t bytes = std::size_t{seg.message()} * count * sizeOf(type);
  auto plan = planFor(coll, bytes);
  if (!plan) return plan.status();
  // What this call is, for the peers to compare before anything moves (WEFT_CHECK_CALLS); the
  // waits below compare it with theirs, and verifyCall once more at the end.
  if (config_.checkCalls) postCall(coll, count, type, op, root);
  struct EndCall {
    std::atomic<bool>& inCall;
    ~EndCall() { inCall.store(false, std::memory_order_release); }
  } endCall{inCall_};
  // Paths that read peers' buffers in place (the direct path, single copy) would read past a
  // peer's smaller buffer on a mismatched count: there every peer's call is compared first.
  const bool byReference = config_.singleCopyBytes > 0 && bytes >= config_.singleCopyBytes;
  const bool readsPeers = plan->kernel == algo::Kernel::hostDirect ||
                          (plan->kernel != algo::Kernel::slots && byReference);
  if (config_.checkCalls && readsPeers) {
    if (Status s = verifyCall(); !s) return s;
  }
  if (plan->kernel == algo::Kernel::slots || plan->kernel == algo::Kernel::hostDirect) {
    const bool slots = plan->kernel == algo::Kernel::slots;
    if (!slots && (config_.debug == "INFO" || config_.debug == "TRACE") && rank_ == 0) {
      std::fprintf(stderr, "weft INFO %s %zu bytes: direct, up to %zu thread(s) (%s)\n",
                   std::string(name(coll)).c_str(), bytes, directGroup_.threads,
                   plan->reason.c_str());
    }
    const exec::DirectCall call{coll, input, output, count, type, op, root};
    Status s = slots ? exec::runSlots(call, slotsGroup_, slotsCalls_)
                     : exec::runDirect(call, directGroup_, directState_);
    if (!s) return fail(s);
  } else if (Status s = runSchedule(coll, *plan, input, output, count, type, op, root); !s) {
    return s;
  }
  if (config_.checkCalls && !readsPeers) {
    if (Status s = verifyCall(); !s) return s;
  }
  if (op == RedOp::avg && output != nullptr && (coll != Collective::reduce || rank_ == root)) {
    exec::divide(output, output, count, type, static_cast<std::uint64_t>(size_));
  }
  return {};
}

Status Communicator::runSchedule(Collective coll, const algo::Plan& plan, const void* input,
                                 void* output, std::size_t count, DataType type, RedOp op,
                                 int root) {
  const algo::Segments seg = algo::segments(coll, size_);
  const std::size_t bytes = std::size_t{seg.message()} * count * sizeOf(type);
  auto cached = scheduleFor(coll, plan, root, geometry_.channels);
  if (!cached) return cached.status();
  const algo::Schedule& s = (*cached)->schedule;
  const std::size_t message =
      std::min(geometry_.slotBytes, std::max<std::size_t>(plan.chunkBytes, 4096));
  const exec::Geometry g = exec::Geometry::of(s, count, type, (*cached)->maxBlocks, message);
  if (config_.debug == "INFO" || config_.debug == "TRACE") {
    if (rank_ == 0) {
      // What runs: the plan's channels as the FIFOs allow, slices as the slots allow.
      std::size_t named = 0, sending = 0;
      const algo::Program& p0 = s.program(0, 0);
      for (std::size_t i = 0; i < p0.steps().size(); ++i) {
        if (p0.sendPeers(p0.steps()[i]).empty()) continue;
        ++sending;
        named += (*cached)->byReference[0][0][i];
      }
      const bool single = config_.singleCopyBytes > 0 && bytes >= config_.singleCopyBytes;
      std::fprintf(stderr,
                   "weft INFO %s %zu bytes: %s/%s, %zu channel(s), %zu-element slices, single "
                   "copy %s (%s)\n",
                   std::string(name(coll)).c_str(), bytes, plan.algorithm.c_str(),
                   std::string(algo::name(plan.protocol)).c_str(), s.channels.size(), g.sliceElems,
                   single ? (std::to_string(named) + " of " + std::to_string(sending) +
                             " sending steps on rank 0")
                                .c_str()
                          : "off",
                   plan.reason.c_str());
    }
  }

  if (scratch_.size() < g.scratchElems * sizeOf(type))
    scratch_.resize(g.scratchElems * sizeOf(type));
  exec::Buffers b{input, output, scratch_.data(), count, type, op};
  b.inputBytes = std::size_t{seg.input} * count * sizeOf(type);
  b.outputBytes = std::size_t{seg.output} * count * sizeOf(type);
  b.singleCopy = config_.singleCopyBytes > 0 && bytes >= config_.singleCopyBytes;
  b.byReference = &(*cached)->byReference;
  std::vector<Status> results(s.channels.size());
  auto channel = [&](std::size_t ch) {
    results[ch] = exec::runChannel(s, ch, rank_, g, b, links_[ch], *waiter_);
    if (results[ch].isOk() && ucx_) results[ch] = ucx_->flush(static_cast<int>(ch), *waiter_);
    if (!results[ch].isOk()) (void)fail(results[ch]);
  };
  if (channelsInline_) {
    for (std::size_t ch = 0; ch < results.size() && (ch == 0 || results[ch - 1].isOk()); ++ch)
      channel(ch);
  } else {
    workers_->run(results.size(), channel);
  }
  for (const Status& r : results) {
    if (!r.isOk()) return r;
  }
  return {};
}

Result<algo::Plan> Communicator::planFor(Collective coll, std::size_t count, DataType type,
                                         bool gpu) {
  if (Status s = checkUsable("plan"); !s) return s;
  const std::size_t es = sizeOf(type);
  if (coll == Collective::allToAllv || coll == Collective::sendRecv) {
    if (gpu) {
      return Status(Code::unsupported,
                    std::string(name(coll)) + " on GPU buffers is not supported yet: no GPU plan");
    }
    return planFor(coll, count * es);
  }
  if (Status s = checkCount("plan", count, static_cast<std::size_t>(size_), type); !s) return s;
  const std::size_t message = algo::segments(coll, size_).message();
  return gpu ? gpuPlanFor(coll, message * count * es) : planFor(coll, message * count * es);
}

Communicator::HostCounters Communicator::hostCounters() const {
  HostCounters h;
  h.singleCopyBytes = readRate_ ? readRate_->bytesRead() : 0;
  h.readablePeers = static_cast<int>(std::count(iRead_.begin(), iRead_.end(), 1));
  h.directInPlaceCalls = directState_.inPlaceCalls;
  h.peerAllocationsMapped = directState_.peerAllocations->mappings();
  return h;
}

Status Communicator::allReduce(const void* send, void* recv, std::size_t count, DataType type,
                               RedOp op, void* stream) {
  if (Status s = check(Collective::allReduce, send, recv, count, type, 0); !s) return s;
  return run(Collective::allReduce, send, recv, count, type, op, 0, stream);
}

Status Communicator::allGather(const void* send, void* recv, std::size_t count, DataType type,
                               void* stream) {
  if (Status s = check(Collective::allGather, send, recv, count, type, 0); !s) return s;
  return run(Collective::allGather, send, recv, count, type, RedOp::sum, 0, stream);
}

Status Communicator::reduceScatter(const void* send, void* recv, std::size_t count, DataType type,
                                   RedOp op, void* stream) {
  if (Status s = check(Collective::reduceScatter, send, recv, count, type, 0); !s) return s;
  return run(Collective::reduceScatter, send, recv, count, type, op, 0, stream);
}

Status Communicator::broadcast(const void* send, void* recv, std::size_t count, DataType type,
                               int root, void* stream) {
  if (Status s = check(Collective::broadcast, send, recv, count, type, root); !s) return s;
  return run(Collective::broadcast, send, recv, count, type, RedOp::sum, root, stream);
}

Status Communicator::reduce(const void* send, void* recv, std::size_t count, DataType type,
                            RedOp op, int root, void* stream) {
  if (Status s = check(Collective::reduce, send, recv, count, type, root); !s) return s;
  return run(Collective::reduce, send, recv, count, type, op, root, stream);
}

Status Communicator::allToAll(const void* send, void* recv, std::size_t count, DataType type,
                              void* stream) {
  if (Status s = check(Collective::allToAll, send, recv, count, type, 0); !s) return s;
  return run(Collective::allToAll, send, recv, count, type, RedOp::sum, 0, stream);
}

Status Communicator::barrier() {
  // One byte all-reduced: every rank has entered before any leaves.
  std::uint8_t in = 0, out = 0;
  return run(Collective::allReduce, &in, &out, 1, DataType::u8, RedOp::max, 0, nullptr);
}

// Point-to-point streams through channel 0's FIFO in slot-sized messages; both sides know the
// count, so they agree on the slicing.
Status Communicator::send(const void* buf, std::size_t count, DataType type, int peer,
                          void* stream) {
  if (Status s = checkP2p("send", buf, count, type, peer); !s) return s;
  return exchange({{true, peer, static_cast<std::byte*>(const_cast<void*>(buf)),
                    count * sizeOf(type), stream}});
}

Status Communicator::recv(void* buf, std::size_t count, DataType type, int peer, void* stream) {
  if (Status s = checkP2p("recv", buf, count, type, peer); !s) return s;
  return exchange({{false, peer, static_cast<std::byte*>(buf), count * sizeOf(type), stream}});
}

Status Communicator::exchange(std::vector<P2pOp> ops) {
  if (ops.empty()) return {};
  // GPU buffers (every operation of the batch that moves bytes, on one stream), or host buffers
  // (no stream).
  std::size_t onGpu = 0, moving = 0;
  for (const P2pOp& op : ops) {
    if (op.bytes == 0) continue;
    ++moving;
    onGpu += exec::isDevicePointer(op.buf) ? 1 : 0;
  }
  if (onGpu > 0 && onGpu < moving) {
    return Status(Code::invalidUsage, "rank " + std::to_string(rank_) +
                                          ": a batch of sends and receives mixes GPU and host "
                                          "buffers; use one kind per group");
  }
  for (const P2pOp& op : ops) {
    if (op.stream != ops.front().stream) {
      return Status(Code::invalidUsage, "rank " + std::to_string(rank_) +
                                            ": the sends and receives of one group must use "
                                            "one stream");
    }
    // Operations of no bytes are no-ops on either path (as in NCCL), whatever their buffers.
    if (onGpu == 0 && moving > 0 && op.stream != nullptr) {
      return Status(Code::invalidUsage,
                    std::string(op.isSend ? "send" : "recv") +
                        ": a stream was given with host buffers (streams order calls on GPU "
                        "buffers; pass NULL)");
    }
  }
  // To itself (as NCCL allows inside a group): the k-th send meets the k-th receive, checked
  // before anything moves.
  std::vector<const P2pOp*> selfSends, selfRecvs;
  for (const P2pOp& op : ops) {
    if (op.peer == rank_) (op.isSend ? selfSends : selfRecvs).push_back(&op);
  }
  if (selfSends.size() != selfRecvs.size()) {
    return invalidArgument("rank " + std::to_string(rank_) + ": " +
                           std::to_string(selfSends.size()) + " send(s) to itself but " +
                           std::to_string(selfRecvs.size()) +
                           " receive(s) from itself; each needs its match in the same group");
  }
  for (std::size_t k = 0; k < selfSends.size(); ++k) {
    if (selfSends[k]->bytes != selfRecvs[k]->bytes) {
      return invalidArgument("rank " + std::to_string(rank_) + ": a send to itself of " +
                             std::to_string(selfSends[k]->bytes) + " bytes meets a receive of " +
                             std::to_string(selfRecvs[k]->bytes));
    }
  }
  if (onGpu > 0) {
    if (Status s = checkUsable("send/recv"); !s) return s;
    if (!exec::cudaBuilt())
      return Status(Code::unsupported, "send/recv: GPU buffers, but this build has no CUDA");
    if (Status s = ensureGpu(); !s) return s;
    if (config_.checkCalls) {
      if (Status s = checkOps(ops, OpsCheck::gpu); !s) return s;
    }
    gpu_->sign(config_.checkCalls ? 1 : 0);  // each message signed with its operation's size
    std::vector<exec::CudaExecutor::P2p> batch;
    for (const P2pOp& op : ops) batch.push_back({op.isSend, op.peer, op.buf, op.bytes});
    // Ordered after the communicator's previous operation, as a collective is.
    void* stream = ops.front().stream;
    if (Status s = gpu_->begin(stream); !s) return fail(s);
    if (Status s = gpu_->exchange(batch, stream); !s) return fail(s);
    if (Status s = gpu_->end(stream); !s) return fail(s);
    return {};
  }
  for (std::size_t k = 0; k < selfSends.size(); ++k) {
    if (selfSends[k]->bytes > 0)
      std::memmove(selfRecvs[k]->buf, selfSends[k]->buf, selfSends[k]->bytes);
  }
  // Every receive's size against its send's before anything moves (WEFT_CHECK_CALLS); through
  // UCX each message's size is compared on arrival instead (unsigned: no call's signature).
  if (config_.checkCalls) {
    if (Status s = checkOps(ops, OpsCheck::before); !s) return s;
    if (ucx_) ucx_->sign(0);
  }
  // Per (direction, peer): the operations in call order; only the first unfinished one moves.
  // Sends come first in each pass, so a rank names its buffers before it spends a single-copy
  // read on a peer's: with receives first, two ranks exchanging 1 MB took turns, each posting
  // only after its own read (267 us a call on the 2-core VM where one read takes ~60).
  std::map<std::pair<bool, int>, std::vector<std::size_t>> lanes;  // key: (receives, peer)
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].bytes > 0 && ops[i].peer != rank_) lanes[{!ops[i].isSend, ops[i].peer}].push_back(i);
  }
  struct Lane {
    std::vector<std::size_t> ops;
    std::size_t next = 0, done = 0;  // which op, and its bytes moved so far
    bool posted = false;             // single copy: the descriptor is out, awaiting release
  };
  std::vector<Lane> active;
  for (auto& [key, list] : lanes) active.push_back({std::move(list)});
  std::size_t open = active.size();
  Status failure;
  const std::size_t slot = geometry_.slotBytes;
  auto mismatch = [&](const P2pOp& op) {
    return Status(Code::invalidUsage, "rank " + std::to_string(rank_) + ": receive from rank " +
                                          std::to_string(op.peer) + " of " +
                                          std::to_string(op.bytes) +
                                          " bytes met a send of a different size");
  };
  auto progress = [&] {
    bool moved = false;
    for (Lane& l : active) {
      if (l.next == l.ops.size()) continue;
      P2pOp& op = ops[l.ops[l.next]];
      const auto Q = static_cast<std::size_t>(op.peer);
      std::size_t n = std::min(slot, op.bytes - l.done);
      if (op.isSend && (l.posted || (l.done == 0 && namesTo(Q, op.bytes)))) {
        // One message names the buffer; the receiver reads it and releases the message, after
        // which the buffer is the caller's again.
        transport::Connection* c = links_[0].to[Q];
        if (!l.posted) {
          std::byte* dst = c->tryAcquire();
          if (dst == nullptr) continue;
          const SingleCopy d{kSingleCopyMagic, reinterpret_cast<std::uintptr_t>(op.buf), op.bytes};
          transport::handOff(op.buf);
          std::memcpy(dst, &d, sizeof d);
          c->postReference(sizeof d);
          l.posted = moved = true;
          continue;
        }
        if (!c->drained()) continue;
        transport::takeOver(op.buf);
        l.posted = false;
        n = op.bytes;
      } else if (op.isSend) {
        std::byte* dst = links_[0].to[Q]->tryAcquire();
        if (dst == nullptr) continue;
        std::memcpy(dst, op.buf + l.done, n);
        links_[0].to[Q]->post(n);
      } else {
        transport::Connection* c = links_[0].from[Q];
        auto m = c->tryReceive();
        if (!m) continue;
        if (c->isReference()) {
          SingleCopy d{};
          if (m->size() == sizeof d) std::memcpy(&d, m->data(), sizeof d);
          if (d.magic != kSingleCopyMagic || d.bytes != op.bytes) {
            c->release();
            failure = mismatch(op);
            return true;
          }
          failure = readRate_->read(peerMemory_[Q], op.buf, d.address, op.bytes);
          c->release();
          if (!failure.isOk()) return true;
          n = op.bytes;
        } else {
          if (m->size() != n) {
            c->release();
            failure = mismatch(op);
            return true;
          }
          std::memcpy(op.buf + l.done, m->data(), n);
          c->release();
        }
      }
      moved = true;
      l.done += n;
      if (l.done == op.bytes) {
        l.done = 0;
        if (++l.next == l.ops.size()) --open;
      }
    }
    return moved || open == 0;
  };
  while (open > 0) {
    int waitingOn = rank_;
    for (const Lane& l : active) {
      if (l.next < l.ops.size()) waitingOn = ops[l.ops[l.next]].peer;
    }
    if (Status s = waiter_->wait(progress, "exchanging with", waitingOn); !s) return fail(s);
    if (!failure.isOk()) return fail(failure);
  }
  if (ucx_) {
    if (Status s = ucx_->flush(0, *waiter_); !s) return fail(s);
  }
  if (config_.checkCalls)
    return checkOps(ops, OpsCheck::after);  // each send, where its receive posted
  return {};
}

Status Communicator::allToAllv(const void* send, const std::size_t* sendCounts,
                               const std::size_t* sendDispls, void* recv,
                               const std::size_t* recvCounts, const std::size_t* recvDispls,
                               DataType type, void* stream) {
  const char* what = "allToAllv";
  if (Status s = checkAllToAllv(send, sendCounts, sendDispls, recv, recvCounts, recvDispls, type);
      !s)
    return s;
  const auto self = static_cast<std::size_t>(rank_);
  std::size_t sent = 0;  // cannot wrap: each count is below PTRDIFF_MAX / size_ elements
  for (int q = 0; q < size_; ++q) sent += sendCounts[static_cast<std::size_t>(q)];
  if (Status s = checkUsable(what); !s) return s;
  // The tuner's plan fixes the order of the exchanges; the point-to-point engine runs them.
  auto plan = planFor(Collective::allToAllv, sent * sizeOf(type));
  if (!plan) return plan.status();
  auto cached = scheduleFor(Collective::allToAllv, *plan, 0, geometry_.channels);
  if (!cached) return cached.status();
  const algo::Program& p = (*cached)->schedule.program(0, rank_);
  const std::size_t es = sizeOf(type);
  auto* in = static_cast<std::byte*>(const_cast<void*>(send));
  auto* out = static_cast<std::byte*>(recv);
  std::vector<P2pOp> ops;
  for (const algo::Step& st : p.steps()) {
    for (int q : p.sendPeers(st)) {
      const auto Q = static_cast<std::size_t>(q);
      ops.push_back({true, q, in + sendDispls[Q] * es, sendCounts[Q] * es, stream});
    }
    for (int q : p.recvPeers(st)) {
      const auto Q = static_cast<std::size_t>(q);
      ops.push_back({false, q, out + recvDispls[Q] * es, recvCounts[Q] * es, stream});
    }
  }
  // Its own block: a send to itself that the batch pairs with the receive (a memmove on the
  // host, a device copy on the stream).
  if (sendCounts[self] > 0) {
    ops.push_back({true, rank_, in + sendDispls[self] * es, sendCounts[self] * es, stream});
    ops.push_back({false, rank_, out + recvDispls[self] * es, recvCounts[self] * es, stream});
  }
  return exchange(std::move(ops));
}

}  // namespace weft
