#include "algorithms/simulator.hpp"

#include "algorithms/patterns.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <unordered_map>

namespace weft::algo {

namespace {

// Above this many ranks a symmetric schedule is replayed on host 0 alone.
constexpr int kFullReplayRanks = 1024;
constexpr double kBytesPerUsPerGBs = 1e3;
// Time-based link sharing sorts every (send, link) pair of a pass; above this many the first
// guess (flows of one step index share) stands, and SimResult::timeShared says so.
constexpr std::size_t kTimeSharingIncidences = 8'000'000;
// Time-based sharing runs kFixedPasses passes, the figures of docs/perf.md's grids. With
// SimOptions::settle it is iterated until kFlat passes in a row lie within kSettledFraction. Some
// schedules never settle: their ranks drift apart and together again from pass to pass (pairwise
// all-to-all over shared NICs swings by a few per cent for ever). Their replay is the mean of the
// last kWindow passes once that mean moves by less than kSettledFraction from the window before.
// At most kTimeSharingIterations passes, fewer for a large job: as many as sort kTimeSharingWork
// (send, link) pairs all told, but never under kTimeSharingLeast; SimResult says where it stopped.
constexpr int kFixedPasses = 3;
constexpr int kTimeSharingIterations = 64;
constexpr int kTimeSharingLeast = 3;
constexpr int kFlat = 3;
constexpr int kWindow = 8;
constexpr double kSettledFraction = 5e-3;
constexpr std::size_t kTimeSharingWork = 16'000'000;

// The running transfers' end times, a binary heap keyed by transfer: re-rating a transfer moves
// its entry instead of leaving a stale one behind (with stale entries the heap grew to millions
// and sifting it was 90 % of a replay). Ties go to the lower key, so a replay is reproducible.
class EndTimes {
 public:
  explicit EndTimes(std::size_t keys) : at_(keys, kAbsent) {}
  bool empty() const { return heap_.empty(); }
  double firstTime() const { return heap_.front().t; }
  std::uint32_t first() const { return heap_.front().key; }
  void set(std::uint32_t key, double t) {
    std::size_t i = at_[key];
    if (i == kAbsent) {
      i = heap_.size();
      heap_.push_back({t, key});
    } else {
      heap_[i].t = t;
    }
    fix(i);
  }
  void erase(std::uint32_t key) {
    const std::size_t i = at_[key];
    at_[key] = kAbsent;
    const Entry last = heap_.back();
    heap_.pop_back();
    if (i == heap_.size()) return;
    heap_[i] = last;
    fix(i);
  }

 private:
  struct Entry {
    double t;
    std::uint32_t key;
  };
  static constexpr std::size_t kAbsent = std::numeric_limits<std::size_t>::max();
  static bool before(const Entry& a, const Entry& b) {
    return a.t != b.t ? a.t < b.t : a.key < b.key;
  }
  void put(std::size_t i, const Entry& e) {
    heap_[i] = e;
    at_[e.key] = i;
  }
  void fix(std::size_t i) {
    const Entry e = heap_[i];
    while (i > 0 && before(e, heap_[(i - 1) / 2])) {
      put(i, heap_[(i - 1) / 2]);
      i = (i - 1) / 2;
    }
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= heap_.size()) break;
      if (c + 1 < heap_.size() && before(heap_[c + 1], heap_[c])) ++c;
      if (!before(heap_[c], e)) break;
      put(i, heap_[c]);
      i = c;
    }
    put(i, e);
  }
  std::vector<Entry> heap_;
  std::vector<std::size_t> at_;
};

LinkClass classOfLink(topo::LinkKind k) {
  return (k == topo::LinkKind::nvlink || k == topo::LinkKind::c2c) ? LinkClass::nvlink
                                                                   : LinkClass::pcie;
}

}  // namespace

Simulator::Simulator(topo::System system, CostConstants constants)
    : system_(std::move(system)), c_(constants) {}

int Simulator::resourcesPerHost() const {
  return static_cast<int>(2 * system_.host().links().size() + 2 * system_.host().nodes().size());
}

// Trees and chains are rooted: they replay in full. The generators say which of theirs are
// translation-symmetric (peers at fixed offsets) or host-swap-symmetric (pairwise and
// hierarchical all-to-all: hosts matched round by round).
bool Simulator::usesSymmetry(const Algorithm& a, Collective coll) const {
  return a.translationSymmetric(coll) ||
         a.hostSwapSymmetric(coll, system_.ranks(), system_.gpusPerHost());
}

bool Simulator::replaysHostZero(const Algorithm& a, Collective coll) const {
  return system_.ranks() > kFullReplayRanks && usesSymmetry(a, coll);
}

Simulator::Flow Simulator::flow(int from, int to, Protocol p, bool hostZeroOnly) const {
  const topo::Topology& host = system_.host();
  const int G = system_.gpusPerHost();
  const int R = resourcesPerHost();
  const int linkCount = static_cast<int>(host.links().size());
  const int ha = hostZeroOnly ? 0 : from / G, hb = hostZeroOnly ? 0 : to / G;
  const int ga = host.gpus()[static_cast<std::size_t>(from % G)];
  const int gb = host.gpus()[static_cast<std::size_t>(to % G)];
  const auto pi = static_cast<std::size_t>(p);
  Flow f;
  auto addRoute = [&](int hostIndex, int a, int b) {
    for (const topo::Hop& h : host.route(a, b))
      f.resources.push_back(hostIndex * R + h.link * 2 + (h.forward ? 0 : 1));
  };
  if (from / G == to / G) {
    addRoute(ha, ga, gb);
    const auto cls = static_cast<std::size_t>(linkClassOf(host.path(ga, gb).cls));
    f.alpha = c_.hopLatency[pi][cls];
    f.overhead = c_.messageOverhead[pi][cls];
    return f;
  }
  const int na = host.nearestNic(ga), nb = host.nearestNic(gb);
  if (na < 0 || nb < 0) {
    f.alpha = std::numeric_limits<double>::infinity();  // hosts without NICs cannot talk
    return f;
  }
  addRoute(ha, ga, na);
  f.resources.push_back(ha * R + 2 * linkCount + 2 * na);      // NIC egress
  f.resources.push_back(hb * R + 2 * linkCount + 2 * nb + 1);  // NIC ingress
  addRoute(hb, nb, gb);
  const bool sameRail = na == nb;
  f.alpha = c_.hopLatency[pi][static_cast<std::size_t>(LinkClass::network)] +
            (sameRail ? 1 : 3) * system_.fabric().switchLatency;
  f.overhead = c_.messageOverhead[pi][static_cast<std::size_t>(LinkClass::network)];
  return f;
}

Result<SimResult> Simulator::run(const Algorithm& algo, Collective coll, std::size_t bytes,
                                 const SimOptions& opt) const {
  const int n = system_.ranks();
  const int G = system_.gpusPerHost();
  if (n < 1 || G < 1) return invalidArgument("simulator: the system has no GPUs to place ranks on");
  const topo::Topology& host = system_.host();
  const auto pi = static_cast<std::size_t>(opt.protocol);
  const double eff = c_.bandwidthEfficiency[pi];
  const int R = resourcesPerHost();
  const int linkCount = static_cast<int>(host.links().size());

  Params params;
  params.channels = opt.channels;
  params.groupSize = G;
  if (algo.name() == "pat") {
    params.aggregation =
        opt.aggregation > 0 ? opt.aggregation : CostModel(c_).patAggregationFor(bytes, n);
  }
  SimResult res;
  if (opt.forceRepresentative && !usesSymmetry(algo, coll)) {
    return invalidArgument("simulator: " + std::string(algo.name()) + " " +
                           std::string(name(coll)) +
                           " has no symmetry between hosts here; it can only be replayed in full");
  }
  const bool translation = algo.translationSymmetric(coll);
  res.representative = opt.forceRepresentative || (!opt.forceFull && replaysHostZero(algo, coll));
  if (res.representative) {
    for (int r = 0; r < G; ++r) params.onlyRanks.push_back(r);
  }
  auto built = algo.build(coll, n, params);
  if (!built) return built.status();
  const Schedule& s = *built;

  auto capacity = [&](int id) {
    const int local = id % R;
    if (local < 2 * linkCount) {
      const topo::Link& l = host.links()[static_cast<std::size_t>(local / 2)];
      return l.bandwidth * c_.bandwidthScale[static_cast<std::size_t>(classOfLink(l.kind))] * eff *
             kBytesPerUsPerGBs;
    }
    const topo::Node& nic = host.nodes()[static_cast<std::size_t>((local - 2 * linkCount) / 2)];
    return nic.speedGBs * c_.bandwidthScale[static_cast<std::size_t>(LinkClass::network)] * eff *
           kBytesPerUsPerGBs;
  };

  // Slices: a message of one slice must fit the chunk.
  const std::vector<int> ranks = ranksToBuild(params, n);
  std::uint32_t maxBlocks = 1;
  std::size_t maxSteps = 0;
  for (std::size_t c = 0; c < s.channels.size(); ++c) {
    for (int r : ranks) {
      const Program& p = s.program(c, r);
      maxSteps = std::max(maxSteps, p.steps().size());
      for (const Step& st : p.steps()) maxBlocks = std::max(maxBlocks, p.blocks(st));
    }
  }
  const double blockBytes = double(bytes) / (double(s.messageBlocks()) * s.partsPerBlock);
  res.slices =
      std::max(1, static_cast<int>(std::ceil(maxBlocks * blockBytes /
                                             double(std::max<std::size_t>(1, opt.chunkBytes)))));
  const double sliceBlock = blockBytes / res.slices;

  // Routes depend only on the pair of ranks: compute each once.
  std::unordered_map<std::uint64_t, Flow> flows;
  auto flowOf = [&](int from, int to) -> const Flow& {
    const std::uint64_t k = static_cast<std::uint64_t>(from) * static_cast<std::uint64_t>(n) +
                            static_cast<std::uint64_t>(to);
    auto it = flows.find(k);
    if (it == flows.end())
      it = flows.emplace(k, flow(from, to, opt.protocol, res.representative)).first;
    return it->second;
  };

  struct Proc {
    std::size_t channel;
    int rank;
    std::size_t pc = 0;
    double ready = 0;
    std::vector<double> seconds = {};      // per peer-pool slot (sends): transfer time at its share
    std::vector<std::uint32_t> conn = {};  // per peer-pool slot: dense connection id
    std::vector<double> begin = {};        // per peer-pool slot (sends): when its transfer began
    std::vector<const Flow*> flow = {};    // per peer-pool slot (sends): its route
  };
  std::vector<Proc> procs;
  for (std::size_t c = 0; c < s.channels.size(); ++c) {
    for (int r : ranks) procs.push_back({c, r});
  }

  // Dense ids for connections (channel, from, to). With symmetry only host 0's ranks run: rank
  // q lives the timeline of host 0's rank q mod G shifted by whole hosts, so its j-th message to
  // r is host 0's (q mod G)'s j-th message to r - (q - q mod G), sent at the same time. With
  // host-swap symmetry its j-th message to host 0's rank r is instead host 0's (q mod G)'s j-th
  // message to rank r of q's host.
  std::unordered_map<std::uint64_t, std::uint32_t> ids;
  auto idOf = [&](std::size_t c, int from, int to) {
    const std::uint64_t k =
        (std::uint64_t{c} * static_cast<std::uint64_t>(n) + static_cast<std::uint64_t>(from)) *
            static_cast<std::uint64_t>(n) +
        static_cast<std::uint64_t>(to);
    return ids.try_emplace(k, static_cast<std::uint32_t>(ids.size())).first->second;
  };
  for (Proc& pr : procs) {
    const Program& p = s.program(pr.channel, pr.rank);
    pr.conn.resize(p.peerPoolSize());
    pr.seconds.resize(p.peerPoolSize());
    pr.flow.resize(p.peerPoolSize());
    for (const Step& st : p.steps()) {
      const auto recvs = p.recvPeers(st);
      for (std::size_t i = 0; i < recvs.size(); ++i) {
        const int q = recvs[i];
        if (res.representative && !translation) {
          pr.conn[st.peerBegin + i] = idOf(pr.channel, q % G, q - q % G + pr.rank);
          continue;
        }
        const int shift = res.representative ? q - q % G : 0;
        pr.conn[st.peerBegin + i] = idOf(pr.channel, q - shift, mod(pr.rank - shift, n));
      }
      const auto sends = p.sendPeers(st);
      for (std::size_t i = 0; i < sends.size(); ++i) {
        pr.conn[st.peerBegin + st.nrecv + i] = idOf(pr.channel, pr.rank, sends[i]);
        pr.flow[st.peerBegin + st.nrecv + i] = &flowOf(pr.rank, sends[i]);
      }
    }
  }

  // Send slots (peer-pool indices past the recvs) of every process, in step order.
  auto forEachSend = [&](auto&& fn) {
    for (std::size_t pi2 = 0; pi2 < procs.size(); ++pi2) {
      Proc& pr = procs[pi2];
      const Program& p = s.program(pr.channel, pr.rank);
      for (const Step& st : p.steps()) {
        const auto sends = p.sendPeers(st);
        for (std::size_t i = 0; i < sends.size(); ++i)
          fn(pi2, pr, p, st, st.peerBegin + st.nrecv + i, *pr.flow[st.peerBegin + st.nrecv + i]);
      }
    }
  };
  const std::size_t resourceCount =
      static_cast<std::size_t>(res.representative ? 1 : system_.hosts()) *
      static_cast<std::size_t>(R);

  // First guess at what runs together: the steps of the same index share each link they cross,
  // a rank's step counting once however many of its messages cross it. Those messages leave one
  // posting apart, so they queue only where one takes longer alone than a posting: message i of
  // the step then waits out i times the difference.
  {
    std::vector<double> load(resourceCount, 0);
    std::vector<int> touched;
    for (std::size_t k = 0; k < maxSteps; ++k) {
      for (int pass = 0; pass < 2; ++pass) {
        for (Proc& pr : procs) {
          const Program& p = s.program(pr.channel, pr.rank);
          if (k >= p.steps().size()) continue;
          const Step& st = p.steps()[k];
          const auto sends = p.sendPeers(st);
          const double weight = 1.0 / static_cast<double>(std::max<std::size_t>(1, sends.size()));
          for (std::size_t i = 0; i < sends.size(); ++i) {
            const Flow& f = *pr.flow[st.peerBegin + st.nrecv + i];
            if (pass == 0) {
              for (int id : f.resources) {
                if (load[static_cast<std::size_t>(id)] == 0) touched.push_back(id);
                load[static_cast<std::size_t>(id)] += weight;
              }
              continue;
            }
            double rate = std::numeric_limits<double>::infinity();
            for (int id : f.resources)
              rate =
                  std::min(rate, capacity(id) / std::max(1.0, load[static_cast<std::size_t>(id)]));
            const double alone = std::isinf(rate) ? 0 : p.blocks(st) * sliceBlock / rate;
            pr.seconds[st.peerBegin + st.nrecv + i] =
                alone + static_cast<double>(i) * std::max(0.0, alone - f.overhead);
          }
        }
      }
      for (int id : touched) load[static_cast<std::size_t>(id)] = 0;
      touched.clear();
    }
  }

  // One pass: a step starts once its rank is free and every message it takes has arrived. A send
  // occupies its rank for the posting and the transfer; the message lands a hop latency later, so
  // latency is paid only by ranks that wait. Records each send's transfer interval.
  for (Proc& pr : procs) {
    pr.begin.assign(pr.seconds.size(), 0);
  }
  auto replay = [&]() -> Status {
    for (Proc& pr : procs) pr.pc = 0, pr.ready = 0;
    std::vector<std::vector<double>> sent(ids.size());
    std::vector<std::size_t> taken(ids.size(), 0);
    std::vector<std::vector<std::size_t>> waiting(ids.size());
    std::vector<std::size_t> work(procs.size());
    for (std::size_t i = 0; i < procs.size(); ++i) work[i] = procs.size() - 1 - i;
    while (!work.empty()) {
      const std::size_t id = work.back();
      work.pop_back();
      Proc& pr = procs[id];
      const Program& p = s.program(pr.channel, pr.rank);
      while (pr.pc < p.steps().size()) {
        const Step& st = p.steps()[pr.pc];
        bool blocked = false;
        for (std::size_t i = 0; i < st.nrecv; ++i) {
          const std::uint32_t c = pr.conn[st.peerBegin + i];
          if (sent[c].size() <= taken[c]) {
            waiting[c].push_back(id);
            blocked = true;
            break;
          }
        }
        if (blocked) break;
        double start = pr.ready;
        for (std::size_t i = 0; i < st.nrecv; ++i) {
          const std::uint32_t c = pr.conn[st.peerBegin + i];
          start = std::max(start, sent[c][taken[c]++]);
        }
        double longest = 0, posted = 0;
        const auto sends = p.sendPeers(st);
        for (std::size_t i = 0; i < sends.size(); ++i) {
          const std::size_t slot = st.peerBegin + st.nrecv + i;
          const Flow& f = *pr.flow[slot];
          posted += f.overhead;  // messages leave one after another
          pr.begin[slot] = start + posted;
          const std::uint32_t c = pr.conn[slot];
          sent[c].push_back(start + posted + f.alpha + pr.seconds[slot]);
          if (!waiting[c].empty()) {
            work.insert(work.end(), waiting[c].begin(), waiting[c].end());
            waiting[c].clear();
          }
          longest = std::max(longest, pr.seconds[slot]);
        }
        pr.ready = start + posted + longest;
        ++pr.pc;
      }
    }
    res.passUs = 0;
    for (const Proc& pr : procs) {
      if (pr.pc < s.program(pr.channel, pr.rank).steps().size()) {
        return internalError("simulator: " + std::string(algo.name()) + " stalled at rank " +
                             std::to_string(pr.rank));
      }
      res.passUs = std::max(res.passUs, pr.ready);
    }
    for (const auto& times : sent) {  // the last messages still have to land
      for (double t : times) res.passUs = std::max(res.passUs, t);
    }
    return {};
  };
  // The fluid replay: every link is shared equally, at each instant, by the transfers crossing it
  // then. Events in time order: a step starts once its rank is free and its messages have landed;
  // its sends begin one posting apart; each transfer drains its bytes at its tightest share, and
  // every start or end of a transfer re-rates the transfers on the links it crosses.
  auto fluidReplay = [&]() -> Status {
    const std::size_t P = procs.size();
    std::vector<std::size_t> base(P + 1, 0);
    for (std::size_t i = 0; i < P; ++i) base[i + 1] = base[i] + procs[i].seconds.size();
    struct Live {
      double left = 0, rate = 0, since = 0;
      std::size_t message = 0;  // its index among its connection's messages
    };
    std::vector<Live> live(base[P]);
    std::vector<std::vector<std::uint32_t>> on(resourceCount);  // the proc-slot ids on each link
    std::vector<double> cap(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) cap[static_cast<std::size_t>(r)] = capacity(r);
    struct Begin {
      double t;
      std::uint64_t seq;
      std::uint32_t proc, slot;
    };
    auto later = [](const Begin& x, const Begin& y) {
      return x.t != y.t ? x.t > y.t : x.seq > y.seq;
    };
    std::vector<Begin> begins;  // a heap: sends posted, their transfers not yet started
    std::uint64_t seq = 0;
    EndTimes ends(base[P]);
    const double unknown = std::numeric_limits<double>::quiet_NaN();
    std::vector<std::vector<double>> sent(ids.size());
    std::vector<std::size_t> taken(ids.size(), 0);
    std::vector<std::vector<std::uint32_t>> waiting(ids.size());
    std::vector<std::size_t> pending(P, 0);
    std::vector<double> postedEnd(P, 0);
    std::vector<std::uint32_t> stamp(base[P], 0);
    std::uint32_t round = 0;
    std::vector<std::uint32_t> touched;
    // The owner of a global flow id.
    auto ownerOf = [&](std::uint32_t g) {
      return static_cast<std::uint32_t>(std::upper_bound(base.begin(), base.end(), g) -
                                        base.begin() - 1);
    };
    auto rateOf = [&](const Flow& f) {
      double rate = std::numeric_limits<double>::infinity();
      for (int id : f.resources) {
        const auto r = static_cast<std::size_t>(id);
        rate = std::min(rate, cap[r % static_cast<std::size_t>(R)] /
                                  static_cast<double>(std::max<std::size_t>(1, on[r].size())));
      }
      return rate;
    };
    auto tryStart = [&](std::uint32_t q, double now) {
      Proc& pr = procs[q];
      const Program& p = s.program(pr.channel, pr.rank);
      while (pr.pc < p.steps().size()) {
        const Step& st = p.steps()[pr.pc];
        for (std::size_t i = 0; i < st.nrecv; ++i) {
          const std::uint32_t c = pr.conn[st.peerBegin + i];
          if (sent[c].size() <= taken[c] || std::isnan(sent[c][taken[c]])) {
            waiting[c].push_back(q);
            return;
          }
        }
        double start = std::max(pr.ready, now);
        for (std::size_t i = 0; i < st.nrecv; ++i) {
          const std::uint32_t c = pr.conn[st.peerBegin + i];
          start = std::max(start, sent[c][taken[c]++]);
        }
        ++pr.pc;
        const auto sends = p.sendPeers(st);
        if (sends.empty()) {
          pr.ready = start;
          continue;
        }
        double posted = 0;
        for (std::size_t i = 0; i < sends.size(); ++i) {
          const std::size_t slot = st.peerBegin + st.nrecv + i;
          posted += pr.flow[slot]->overhead;
          Live& l = live[base[q] + slot];
          l.left = p.blocks(st) * sliceBlock;
          l.message = sent[pr.conn[slot]].size();
          sent[pr.conn[slot]].push_back(unknown);
          begins.push_back({start + posted, seq++, q, static_cast<std::uint32_t>(slot)});
          std::push_heap(begins.begin(), begins.end(), later);
        }
        pending[q] = sends.size();
        postedEnd[q] = start + posted;
        return;
      }
    };
    auto finish = [&](std::uint32_t q, std::uint32_t slot, double t) {
      const Flow& f = *procs[q].flow[slot];
      const std::uint32_t c = procs[q].conn[slot];
      sent[c][live[base[q] + slot].message] = t + f.alpha;
      std::vector<std::uint32_t> woken;
      woken.swap(waiting[c]);
      for (std::uint32_t w : woken) tryStart(w, t);
      if (--pending[q] == 0) {
        procs[q].ready = std::max(postedEnd[q], t);
        tryStart(q, procs[q].ready);
      }
    };
    for (Proc& pr : procs) pr.pc = 0, pr.ready = 0;
    for (std::uint32_t q = 0; q < P; ++q) tryStart(q, 0);
    // Every event of one instant at once: the transfers on the links they cross are brought up to
    // that instant, the starts and ends change the links' counts, and only then is each of those
    // transfers re-rated, getting a new end event where its rate moved.
    std::vector<std::pair<std::uint32_t, std::uint32_t>> ended;  // (proc, slot)
    std::vector<char> running(base[P], 0);
    constexpr double kNever = std::numeric_limits<double>::infinity();
    while (!begins.empty() || !ends.empty()) {
      const double t = std::min(begins.empty() ? kNever : begins.front().t,
                                ends.empty() ? kNever : ends.firstTime());
      const double until = t + 1e-9 * std::max(1.0, t);
      ++round;
      touched.clear();
      ended.clear();
      // Brings the transfers on f's links up to now, once an instant.
      auto settle = [&](const Flow& f) {
        for (int id : f.resources) {
          for (std::uint32_t h : on[static_cast<std::size_t>(id)]) {
            if (stamp[h] == round) continue;
            stamp[h] = round;
            touched.push_back(h);
            Live& lh = live[h];
            lh.left = std::max(0.0, lh.left - lh.rate * (t - lh.since));
            lh.since = t;
          }
        }
      };
      while (!ends.empty() && ends.firstTime() <= until) {
        const std::uint32_t g = ends.first();
        ends.erase(g);
        const std::uint32_t q = ownerOf(g);
        const std::uint32_t slot = g - static_cast<std::uint32_t>(base[q]);
        const Flow& f = *procs[q].flow[slot];
        settle(f);
        for (int id : f.resources) {
          auto& v = on[static_cast<std::size_t>(id)];
          v.erase(std::find(v.begin(), v.end(), g));
        }
        running[g] = 0;
        live[g].left = 0;
        ended.emplace_back(q, slot);
      }
      while (!begins.empty() && begins.front().t <= until) {
        std::pop_heap(begins.begin(), begins.end(), later);
        const Begin b = begins.back();
        begins.pop_back();
        const std::uint32_t g = static_cast<std::uint32_t>(base[b.proc]) + b.slot;
        const Flow& f = *procs[b.proc].flow[b.slot];
        Live& l = live[g];
        if (l.left <= 0 || f.resources.empty() || std::isinf(rateOf(f))) {
          ended.emplace_back(b.proc, b.slot);
          continue;
        }
        settle(f);
        for (int id : f.resources) on[static_cast<std::size_t>(id)].push_back(g);
        running[g] = 1;
        l.since = t;
        l.rate = 0;  // rated below
        if (stamp[g] != round) stamp[g] = round, touched.push_back(g);
      }
      for (std::uint32_t h : touched) {
        if (!running[h]) continue;
        const std::uint32_t q = ownerOf(h);
        const std::uint32_t slot = h - static_cast<std::uint32_t>(base[q]);
        Live& l = live[h];
        const double rate = rateOf(*procs[q].flow[slot]);
        if (rate == l.rate) continue;  // its end time stands
        l.rate = rate;
        ends.set(h, t + l.left / rate);
      }
      for (const auto& [q, slot] : ended) finish(q, slot, t);
    }
    res.passUs = 0;
    for (std::uint32_t q = 0; q < P; ++q) {
      const Proc& pr = procs[q];
      if (pr.pc < s.program(pr.channel, pr.rank).steps().size() || pending[q] != 0) {
        return internalError("simulator: " + std::string(algo.name()) + " stalled at rank " +
                             std::to_string(pr.rank) + " in the fluid replay");
      }
      res.passUs = std::max(res.passUs, pr.ready);
    }
    for (const auto& times : sent) {
      for (double t : times) res.passUs = std::max(res.passUs, t);
    }
    return {};
  };
  const bool fluid = opt.fluid;
  if (Status st = fluid ? fluidReplay() : replay(); !st.ok()) return st;

  // Then what really ran together: each flow shares a link with the flows whose transfers overlap
  // its own, weighted by how long they overlap (the time-average of the link's flow count over its
  // interval). Replayed again with those rates until the pass settles; damped, because slowing a
  // flow lengthens its overlaps.
  std::size_t incidences = 0;
  forEachSend([&](std::size_t, Proc&, const Program&, const Step&, std::size_t, const Flow& f) {
    incidences += f.resources.size();
  });
  res.timeShared = !fluid && incidences <= kTimeSharingIncidences;
  std::vector<double> passes;
  auto windowMean = [&](std::size_t end) {
    double sum = 0;
    for (std::size_t i = end - kWindow; i < end; ++i) sum += passes[i];
    return sum / kWindow;
  };
  for (int iteration = 0; res.timeShared && !res.settled; ++iteration) {
    if (!opt.settle && iteration == kFixedPasses) break;
    if (iteration == kTimeSharingIterations ||
        (iteration >= kTimeSharingLeast &&
         static_cast<std::size_t>(iteration + 1) * incidences > kTimeSharingWork)) {
      if (passes.size() >= kWindow) {  // swinging still: the last window stands for it
        res.passUs = windowMean(passes.size());
        res.swingUs = *std::max_element(passes.end() - kWindow, passes.end()) -
                      *std::min_element(passes.end() - kWindow, passes.end());
      }
      break;
    }
    // Events bucketed by resource (a counting sort), then each bucket sorted by time.
    struct Event {
      double t;
      int delta;
    };
    std::vector<std::size_t> first(resourceCount + 1, 0);
    forEachSend(
        [&](std::size_t, Proc& pr, const Program&, const Step&, std::size_t slot, const Flow& f) {
          if (pr.seconds[slot] <= 0) return;
          for (int id : f.resources) first[static_cast<std::size_t>(id) + 1] += 2;
        });
    for (std::size_t r = 0; r < resourceCount; ++r) first[r + 1] += first[r];
    std::vector<Event> events(first[resourceCount]);
    std::vector<std::size_t> fill(first.begin(), first.end() - 1);
    forEachSend(
        [&](std::size_t, Proc& pr, const Program&, const Step&, std::size_t slot, const Flow& f) {
          const double t0 = pr.begin[slot], t1 = t0 + pr.seconds[slot];
          if (pr.seconds[slot] <= 0) return;
          for (int id : f.resources) {
            events[fill[static_cast<std::size_t>(id)]++] = {t0, +1};
            events[fill[static_cast<std::size_t>(id)]++] = {t1, -1};
          }
        });
    // Per resource: the flow count after each event and the integral of the count up to it.
    std::vector<double> count(events.size()), area(events.size());
    for (std::size_t r = 0; r < resourceCount; ++r) {
      const auto b = static_cast<std::ptrdiff_t>(first[r]);
      const auto e = static_cast<std::ptrdiff_t>(first[r + 1]);
      std::sort(events.begin() + b, events.begin() + e,
                [](const Event& x, const Event& y) { return x.t < y.t; });
      for (std::size_t k = first[r]; k < first[r + 1]; ++k) {
        const bool fresh = k == first[r];
        area[k] = fresh ? 0 : area[k - 1] + count[k - 1] * (events[k].t - events[k - 1].t);
        count[k] = (fresh ? 0 : count[k - 1]) + events[k].delta;
      }
    }
    auto integral = [&](std::size_t r, double t) {
      const auto b = events.begin() + static_cast<std::ptrdiff_t>(first[r]);
      const auto e = events.begin() + static_cast<std::ptrdiff_t>(first[r + 1]);
      const auto it = std::upper_bound(b, e, t, [](double x, const Event& ev) { return x < ev.t; });
      if (it == b) return 0.0;
      const auto k = static_cast<std::size_t>(it - events.begin()) - 1;
      return area[k] + count[k] * (t - events[k].t);
    };
    forEachSend([&](std::size_t, Proc& pr, const Program& p, const Step& st, std::size_t slot,
                    const Flow& f) {
      const double t0 = pr.begin[slot], t1 = t0 + pr.seconds[slot];
      if (pr.seconds[slot] <= 0) return;
      double rate = std::numeric_limits<double>::infinity();
      for (int id : f.resources) {
        const auto r = static_cast<std::size_t>(id);
        const double sharers = std::max(1.0, (integral(r, t1) - integral(r, t0)) / (t1 - t0));
        rate = std::min(rate, capacity(id) / sharers);
      }
      const double secs = p.blocks(st) * sliceBlock / rate;
      pr.seconds[slot] = 0.5 * (pr.seconds[slot] + secs);
    });
    if (Status st = replay(); !st.ok()) return st;
    res.sharingPasses = iteration + 1;
    passes.push_back(res.passUs);
    const std::size_t m = passes.size();
    if (!opt.settle) continue;
    if (m >= kFlat) {
      const auto [lo, hi] = std::minmax_element(passes.end() - kFlat, passes.end());
      res.settled = *hi - *lo <= kSettledFraction * *lo;
    }
    if (!res.settled && m >= 2 * kWindow && m % kWindow == 0) {
      const double now = windowMean(m), then = windowMean(m - kWindow);
      if (std::abs(now - then) <= kSettledFraction * then) {
        res.settled = true;
        res.passUs = now;
        res.swingUs = *std::max_element(passes.end() - kWindow, passes.end()) -
                      *std::min_element(passes.end() - kWindow, passes.end());
      }
    }
  }

  // The pipelined steady state: every step of the pass is busy at once on different slices, so a
  // slice period is bounded by the busiest rank (its postings and transfers, its own messages of a
  // step sharing its links) and by the busiest link (every byte that crosses it in one pass).
  std::vector<double> carried(resourceCount, 0);
  forEachSend(
      [&](std::size_t, Proc&, const Program& p, const Step& st, std::size_t, const Flow& f) {
        for (int id : f.resources)
          carried[static_cast<std::size_t>(id)] += p.blocks(st) * sliceBlock;
      });
  double period = 0;
  for (std::size_t id = 0; id < resourceCount; ++id) {
    if (carried[id] > 0) period = std::max(period, carried[id] / capacity(static_cast<int>(id)));
  }
  std::vector<std::pair<int, int>> own;  // (resource, this step's flows on it)
  for (Proc& pr : procs) {
    const Program& p = s.program(pr.channel, pr.rank);
    double busy = 0;
    for (const Step& st : p.steps()) {
      const std::size_t firstSend = st.peerBegin + st.nrecv;
      const std::size_t sendCount = p.sendPeers(st).size();
      own.clear();
      for (std::size_t i = 0; i < sendCount; ++i) {
        for (int id : pr.flow[firstSend + i]->resources) {
          auto it = std::find_if(own.begin(), own.end(), [&](auto& o) { return o.first == id; });
          if (it == own.end()) {
            own.emplace_back(id, 1);
          } else {
            ++it->second;
          }
        }
      }
      double longest = 0;
      for (std::size_t i = 0; i < sendCount; ++i) {
        const Flow& f = *pr.flow[firstSend + i];
        busy += f.overhead;
        double rate = std::numeric_limits<double>::infinity();
        for (int id : f.resources) {
          const int k =
              std::find_if(own.begin(), own.end(), [&](auto& o) { return o.first == id; })->second;
          rate = std::min(rate, capacity(id) / k);
        }
        if (!std::isinf(rate)) longest = std::max(longest, p.blocks(st) * sliceBlock / rate);
      }
      busy += longest;
    }
    period = std::max(period, busy);
  }
  res.busyUs = period;
  res.timeUs = c_.baseLatency[pi] + res.passUs + (res.slices - 1) * period;
  return res;
}

}  // namespace weft::algo
