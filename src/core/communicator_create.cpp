// Communicator::create: where every rank runs and how it is set up (placement), this rank's inbox,
// UCX and every pair's connections (the mesh), the single-copy probe, and the host runtime's
// threads, slots and direct path.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "algorithms/compression.hpp"
#include "src/bootstrap/socket.hpp"
#include "src/core/communicator.hpp"
#include "src/core/hash.hpp"
#include "src/core/log.hpp"
#include "src/core/sizes.hpp"

namespace weft {
namespace {

// What each rank tells the others about itself at init: first where it runs and how it is set
// up, then (once every pair's transport is known) how to reach it.
struct HostRecord {
  char hostname[64];
  std::uint64_t hostId;  // hostname and boot id: ranks with equal ids share memory
  // The machine and the CPUs this rank may run on: ranks of one machine whose CPUs overlap
  // share cores, whatever host (network namespace, container) they claim.
  CpuClaim cpus;
  std::int32_t pid;
  std::int32_t channels, slots;
  char transport[8];
  std::uint64_t slotBytes;
  std::uint64_t settings;  // a hash of the settings every rank must agree on (Config::agreed)
};
struct ReachRecord {
  char inbox[96];
  std::uint64_t inboxBytes;
  std::uint64_t ucxBytes;                  // this rank's UCX address record (0 without UCX peers)
  std::uint64_t probeAddress, probeValue;  // a word peers try to read (single copy)
};

int coresOrOne(long cores) {
  return static_cast<int>(std::max(1L, cores));
}

// Where every rank has a core for each of its threads, waits spin this long before they nap and
// channel workers this long for their next job (Communicator::create says why).
constexpr std::chrono::microseconds kLongSpin{1000};
constexpr std::chrono::microseconds kWorkerSpin{200};

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
  r.hostId = fnv1a(std::string(r.hostname) + "/" + bootId());
  r.cpus = CpuClaim::ofThisProcess(r.hostId);
}

// NAME -> value of Config::agreed's lines.
std::map<std::string, std::string> settingsOf(const std::string& agreed) {
  std::map<std::string, std::string> out;
  std::size_t at = 0;
  while (at < agreed.size()) {
    const std::size_t end = std::min(agreed.find('\n', at), agreed.size());
    const std::string line = agreed.substr(at, end - at);
    const std::size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
    at = end + 1;
  }
  return out;
}

// Collective: where a rank set a setting every rank must agree on differently from rank 0, every
// rank fails naming the setting and both values.
Status compareSettings(boot::Bootstrap& bootstrap, const std::vector<HostRecord>& hosts,
                       const Config& config) {
  std::size_t other = 0;
  for (std::size_t q = 1; q < hosts.size() && other == 0; ++q) {
    if (hosts[q].settings != hosts[0].settings) other = q;
  }
  if (other == 0) return {};
  struct Text {
    char agreed[2048];
  };
  std::vector<Text> texts(hosts.size());
  std::snprintf(texts[static_cast<std::size_t>(bootstrap.rank())].agreed, sizeof(Text), "%s",
                config.agreed.c_str());
  if (Status s = bootstrap.allGather(texts.data(), sizeof(Text)); !s) return s;
  const auto first = settingsOf(texts[0].agreed), theirs = settingsOf(texts[other].agreed);
  auto valueIn = [](const std::map<std::string, std::string>& m, const std::string& key) {
    const auto it = m.find(key);
    return it == m.end() ? std::string("unset") : it->second;
  };
  // The first setting (in name order, of either rank's) whose values differ.
  std::map<std::string, std::string> both = first;
  both.insert(theirs.begin(), theirs.end());
  std::string name, a = "unset", b = "unset";
  for (const auto& entry : both) {
    if (valueIn(first, entry.first) == valueIn(theirs, entry.first)) continue;
    name = entry.first;
    a = valueIn(first, name);
    b = valueIn(theirs, name);
    break;
  }
  return Status(Code::invalidUsage, "rank " + std::to_string(bootstrap.rank()) + ": rank " +
                                        std::to_string(other) + " sets " +
                                        (name.empty() ? "its settings" : name + "=" + b) +
                                        ", rank 0 " + (name.empty() ? "others" : name + "=" + a) +
                                        "; every rank must set it alike (docs/configuration.md)");
}

}  // namespace

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
  self.settings = fnv1a(config.agreed);
  if (Status s = c->bootstrap_->allGather(hosts.data(), sizeof(HostRecord)); !s) return s;
  if (Status s = compareSettings(*c->bootstrap_, hosts, config); !s) return s;
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
                        " is set up differently (WEFT_HOST_CHANNELS, WEFT_HOST_SLOT_BYTES and "
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
  c->workspacesShared_ = config.hostDirect != 0 && !anyUcx;

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
    if (!config.socketIfname.empty()) {
      auto chosen = boot::chooseInterface(config.socketIfname);
      if (!chosen) return chosen.status();
      ug.netDevice = chosen->name;
      WEFT_INFO(log::kInit | log::kNet, "UCX network device %s (WEFT_SOCKET_IFNAME=%s)",
                ug.netDevice.c_str(), config.socketIfname.c_str());
    }
    ug.tcpLanes = config.tcpLanes;
    ug.connectSeconds = static_cast<double>(config.timeout.count()) / 1000.0;
    if (ug.tcpLanes > 0) {
      // The lanes listen on this host's address (WEFT_SOCKET_IFNAME's interface).
      if (auto chosen = boot::chooseInterface(config.socketIfname); chosen) {
        ug.laneAddress = chosen->address;
      } else {
        WEFT_INFO(log::kInit | log::kNet, "no TCP lanes: %s", chosen.status().message().c_str());
      }
    }
    auto ucx = transport::UcxTransport::create(ug);
    if (!ucx) return ucx.status();
    c->ucx_ = std::move(*ucx);
    if (c->ucx_->eager())
      WEFT_INFO(log::kInit | log::kNet,
                "UCX messages go eagerly (no RDMA device here: UCX_RNDV_THRESH=inf unless set)");
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
    if (c->ucx_->lanePeers() > 0)
      WEFT_INFO(log::kInit | log::kNet,
                "messages to %d rank(s) through TCP lanes (WEFT_TCP_LANES=%d)",
                c->ucx_->lanePeers(), config.tcpLanes);
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
  c->readRate_->onRefuse([me](double gbps) {
    WEFT_WARN(log::kShm,
              "rank %d: reading peers' buffers ran at %.2f GB/s (process_vm_readv, below "
              "WEFT_HOST_SINGLE_COPY_MIN_GBPS): its peers send it bytes through the FIFO from "
              "now on",
              me, gbps);
  });
  c->refuses_.assign(N, nullptr);
  for (std::size_t q = 0; q < N; ++q) {
    if (q != ME && c->sameHost_[q] && !c->viaUcx_[q])
      c->refuses_[q] = &transport::controlOf(c->peerInboxes_[q].data())->refusesReferences;
  }
  // A rank's cores: the direct path's threads take no more (below). Between processes it wants two
  // on every rank (with one it lost to the FIFOs, with two it won); among threads one is enough
  // (docs/perf.md, "The direct path through the stages").
  // Ranks of other hosts count where they share this machine's cores (network namespaces or
  // containers of one machine).
  std::vector<CpuClaim> claims;
  for (const HostRecord& r : hosts) claims.push_back(r.cpus);
  const long coresOrNone = coresOf(claims, ME);
  const int cores = coresOrOne(coresOrNone);
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
  c->staging_.resize(c->links_.size());
  for (int ch = 0; ch < c->geometry_.channels; ++ch) {
    exec::ChannelLinks& l = c->links_[static_cast<std::size_t>(ch)];
    l.staging = &c->staging_[static_cast<std::size_t>(ch)];
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
            transport::raiseAbort(inbox, why);
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
  // thread: on threads they only take turns on that core, and every handover costs a wakeup
  // (docs/perf.md, "Host all-reduce on 2 ranks, the 2-core CI-class machine"). Every channel's
  // traffic stays in its own FIFOs and part of the buffers, so any channel order is one every
  // peer can meet.
  c->channelsInline_ =
      config.hostChannelThreads == 0 || (config.hostChannelThreads < 0 && coresOrNone <= 1);
  // Where each of the rank's threads has a core, waits spin longer before they nap, and the
  // channel workers spin for their next job before they sleep: a nap oversleeps a peer's reply
  // (docs/perf.md, "spinning waits"). A rank whose channels run on its caller has one thread.
  const int threads = c->channelsInline_ ? 1 : c->geometry_.channels;
  const bool spins = coresOrNone >= threads;
  if (spins) c->waiter_->spinFor(kLongSpin);
  // Where the ranks outnumber the host's cores, a spinning wait holds the core its peer needs:
  // waits yield it instead (docs/perf.md, "Oversubscribed: more ranks than cores"). Not where
  // only a rank's channel threads outnumber them: no faster there, and slower at small sizes.
  if (coresOrNone == 0) c->waiter_->yieldWhileSpinning(true);
  c->workers_ = std::make_unique<ChannelWorkers>(
      c->geometry_.channels - 1, spins ? kWorkerSpin : std::chrono::microseconds(0));
  c->hostThreads_ =
      c->channelsInline_ ? 1 : static_cast<std::size_t>(std::min(c->geometry_.channels, cores));
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
    // Ranks that share cores are priced at the fewest share any rank has (alike on every
    // rank): their copies at that share, their phases taking turns on the CPUs
    // (docs/perf-hosts.md).
    const double share = fewestCores(claims);
    c->selector_ = std::make_unique<algo::Selector>(
        algo::hostSelectorFor(c->machine_.placement, c->machine_.netGBs, config.tuner, share, k));
    const algo::RankGraph& graph = c->selector_->tuner().graph();
    if (me == 0)
      WEFT_INFO(log::kInit | log::kGraph | log::kTuning,
                "host calls priced on %d host(s) of %d rank(s) at most, copying at %.2g GB/s a "
                "rank (%.2g cores a rank at the fewest)",
                graph.hosts, graph.ranksPerHost,
                c->selector_->options().constants.graphs.hostCopyGBs, share);
  }
  c->created_ = true;
  // What NCCL_DEBUG=INFO users look for at init: who this rank is, how it talks to its peers,
  // and the machine it prices calls on.
  WEFT_INFO(log::kInit, "comm %p: %s", static_cast<void*>(c.get()), c->summary().c_str());
  if (me == 0 && compresses(config.compression))
    WEFT_INFO(log::kInit | log::kEnv,
              "WEFT_COMPRESS=%s: bf16, f16 and f32 sums and averages of the compressed calls (the "
              "NCCL interface's all-reduces and reduce-scatters) cross as fp8 where the selector "
              "prices that cheaper; their results change (docs/api.md, \"Compressed collectives\")",
              compressionName(config.compression).c_str());
  if (me == 0 && c->machine_.host)
    WEFT_INFO(log::kInit | log::kGraph, "topology (%s, %d host(s)): %s", c->machine_.source.c_str(),
              c->machine_.placement.hosts(), c->machine_.host->summary().c_str());
  return c;
}

}  // namespace weft
