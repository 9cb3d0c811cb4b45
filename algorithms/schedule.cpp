#include "algorithms/schedule.hpp"

#include <sstream>

namespace weft::algo {

BlockList& BlockList::add(Buf buf, std::uint32_t block) {
  if (!spans_.empty()) {
    Span& last = spans_.back();
    if (last.buf == buf) {
      if (last.count == 1 && block != last.first) {
        last.stride = static_cast<std::int32_t>(block) - static_cast<std::int32_t>(last.first);
        last.count = 2;
        ++size_;
        return *this;
      }
      if (last.count > 1 && static_cast<std::int64_t>(block) ==
                                static_cast<std::int64_t>(last.last()) + last.stride) {
        ++last.count;
        ++size_;
        return *this;
      }
    }
  }
  spans_.push_back({buf, block, 1, 1});
  ++size_;
  return *this;
}

BlockList& BlockList::addRange(Buf buf, std::uint32_t first, std::uint32_t count) {
  if (count == 0) return *this;
  if (count == 1) return add(buf, first);
  if (!spans_.empty()) {
    Span& last = spans_.back();
    const bool unitRun = last.count == 1 || last.stride == 1;
    if (last.buf == buf && unitRun && first == last.last() + 1) {
      last.stride = 1;
      last.count += count;
      size_ += count;
      return *this;
    }
  }
  spans_.push_back({buf, first, count, 1});
  size_ += count;
  return *this;
}

BlockList& BlockList::append(const BlockList& other) {
  for (const Span& sp : other.spans_) {
    if (sp.stride == 1) {
      addRange(sp.buf, sp.first, sp.count);
    } else {
      for (std::uint32_t i = 0; i < sp.count; ++i) add(sp.buf, sp.at(i));
    }
  }
  return *this;
}

std::string_view name(StepKind k) {
  switch (k) {
    case StepKind::send:
      return "send";
    case StepKind::recv:
      return "recv";
    case StepKind::recvReduceSend:
      return "recvReduceSend";
    case StepKind::recvCopySend:
      return "recvCopySend";
    case StepKind::recvReduceCopy:
      return "recvReduceCopy";
    case StepKind::recvReduceCopySend:
      return "recvReduceCopySend";
    case StepKind::copy:
      return "copy";
    case StepKind::reduceLocal:
      return "reduceLocal";
  }
  return "?";
}

std::string_view name(Buf b) {
  switch (b) {
    case Buf::input:
      return "in";
    case Buf::output:
      return "out";
    case Buf::scratch:
      return "tmp";
  }
  return "?";
}

std::uint32_t Program::blocks(const Step& s) const {
  std::uint32_t n = 0;
  for (const Span& sp : (s.nsrc > 0 ? src(s) : dst(s))) n += sp.count;
  return n;
}

std::uint32_t Program::pushSpans(const BlockList& list) {
  const auto begin = static_cast<std::uint32_t>(spans_.size());
  spans_.insert(spans_.end(), list.spans().begin(), list.spans().end());
  return begin;
}

void Program::add(StepKind kind, const Peers& recvFrom, const Peers& sendTo, const BlockList& src,
                  const BlockList& dst) {
  Step s;
  s.kind = kind;
  s.peerBegin = static_cast<std::uint32_t>(peers_.size());
  s.nrecv = static_cast<std::uint32_t>(recvFrom.size());
  s.nsend = static_cast<std::uint32_t>(sendTo.size());
  peers_.insert(peers_.end(), recvFrom.begin(), recvFrom.end());
  peers_.insert(peers_.end(), sendTo.begin(), sendTo.end());
  s.srcBegin = pushSpans(src);
  s.nsrc = static_cast<std::uint32_t>(src.spans().size());
  s.dstBegin = pushSpans(dst);
  s.ndst = static_cast<std::uint32_t>(dst.spans().size());
  steps_.push_back(s);
}

void Program::duplicateStep(std::size_t i) {
  const Step copy = steps_.at(i);
  steps_.insert(steps_.begin() + static_cast<std::ptrdiff_t>(i) + 1, copy);
}

Segments segments(Collective coll, int nranks) {
  const auto n = static_cast<std::uint32_t>(nranks);
  switch (coll) {
    case Collective::allGather:
      return {1, n};
    case Collective::reduceScatter:
      return {n, 1};
    case Collective::allToAll:
    case Collective::allToAllv:
      return {n, n};
    default:
      return {1, 1};
  }
}

Schedule Schedule::make(Collective coll, int nranks, std::string algorithm,
                        std::uint32_t blocksPerSegment, std::uint32_t channels) {
  Schedule s;
  s.coll = coll;
  s.nranks = nranks;
  s.algorithm = std::move(algorithm);
  s.blocksPerSegment = blocksPerSegment;
  s.channels.resize(channels);
  for (auto& ch : s.channels) ch.ranks.resize(static_cast<std::size_t>(nranks));
  return s;
}

Schedule splitChannels(const Schedule& s, std::uint32_t factor) {
  Schedule out = s;
  if (factor <= 1) return out;
  out.partsPerBlock = s.partsPerBlock * factor;
  out.channels.clear();
  for (std::uint32_t f = 0; f < factor; ++f) {
    for (const ChannelSchedule& ch : s.channels) {
      ChannelSchedule copy = ch;
      copy.part = ch.part * factor + f;
      out.channels.push_back(std::move(copy));
    }
  }
  return out;
}

namespace {

void printSpans(std::ostringstream& os, std::span<const Span> spans) {
  bool firstSpan = true;
  for (const Span& sp : spans) {
    if (!firstSpan) os << ",";
    firstSpan = false;
    os << name(sp.buf) << "[";
    if (sp.count == 1) {
      os << sp.first;
    } else if (sp.stride == 1) {
      os << sp.first << ".." << sp.last();
    } else {
      os << sp.first << ".." << sp.last() << "/" << sp.stride;
    }
    os << "]";
  }
}

void printPeers(std::ostringstream& os, std::span<const int> peers) {
  for (std::size_t i = 0; i < peers.size(); ++i) os << (i ? "," : "") << peers[i];
}

}  // namespace

std::string describe(const Schedule& s, int rank) {
  std::ostringstream os;
  for (std::size_t c = 0; c < s.channels.size(); ++c) {
    const Program& p = s.program(c, rank);
    os << "channel " << c << " (part " << s.channels[c].part << "/" << s.partsPerBlock << "), "
       << p.steps().size() << " steps\n";
    for (std::size_t i = 0; i < p.steps().size(); ++i) {
      const Step& st = p.steps()[i];
      os << "  " << i << " " << name(st.kind);
      if (st.nrecv > 0) {
        os << " from ";
        printPeers(os, p.recvPeers(st));
      }
      if (st.nsrc > 0) {
        os << " src ";
        printSpans(os, p.src(st));
      }
      if (st.ndst > 0) {
        os << " dst ";
        printSpans(os, p.dst(st));
      }
      if (st.nsend > 0) {
        os << " to ";
        printPeers(os, p.sendPeers(st));
      }
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace weft::algo
