#include "fused/fp8/compressed.hpp"

#include <vector>

#include "algorithms/compression.hpp"
#include "fused/fp8/codec.hpp"
#include "fused/fp8/codec_device.hpp"
#include "src/exec/cuda_executor.hpp"

namespace weft::fused::fp8 {
namespace {

Status plain(Communicator& c, const CompressedCall& x) {
  switch (x.coll) {
    case Collective::allReduce:
      return c.allReduce(x.send, x.recv, x.count, x.type, x.op, x.stream);
    case Collective::reduceScatter:
      return c.reduceScatter(x.send, x.recv, x.count, x.type, x.op, x.stream);
    default:
      return c.allGather(x.send, x.recv, x.count, x.type, x.stream);
  }
}

// Where the encoded shares lie in the workspace: what this rank sends, what it receives, its
// reduced share (all-reduce) and everyone's (all-reduce's gather), and on the host the sums.
struct Parts {
  std::byte* send = nullptr;
  std::byte* recv = nullptr;
  std::byte* mine = nullptr;
  std::byte* gathered = nullptr;
  float* sums = nullptr;
};

// The steps of the compressed call, on host memory (`device` false) or the GPU.
class Steps {
 public:
  Steps(Communicator& c, const Codec& codec, const algo::CodecShape& shape, const CompressedCall& x,
        bool device)
      : c_(c),
        codec_(codec),
        shape_(shape),
        x_(x),
        device_(device),
        n_(static_cast<std::size_t>(c.size())) {}

  Status run() {
    switch (x_.coll) {
      case Collective::allReduce:
        return allReduce();
      case Collective::reduceScatter:
        return reduceScatter();
      default:
        return allGather();
    }
  }

 private:
  float divisor() const { return x_.op == RedOp::avg ? static_cast<float>(n_) : 1.0f; }

  Result<Parts> parts(const Segments& seg, bool reduced, bool gathered) {
    const std::size_t e = seg.segmentBytes;
    const std::size_t sums = device_ ? 0 : seg.padded * sizeof(float);
    const std::size_t need = 2 * seg.bytes() + (reduced ? e : 0) + (gathered ? seg.bytes() : 0);
    auto ws = c_.workspace(need + sums, device_);
    if (!ws) return ws.status();
    Parts p;
    p.send = *ws;
    p.recv = p.send + seg.bytes();
    p.mine = p.recv + seg.bytes();
    p.gathered = p.mine + (reduced ? e : 0);
    if (!device_) p.sums = reinterpret_cast<float*>(*ws + need);
    return p;
  }

  Status encode(const void* in, const Segments& seg, std::byte* out) {
    return device_ ? encodeSegmentsOnDevice(codec_, x_.type, in, seg, out, x_.stream)
                   : encodeSegments(codec_, x_.type, in, seg, out);
  }
  Status decode(const std::byte* in, const Segments& seg, void* out) {
    return device_ ? decodeSegmentsOnDevice(codec_, x_.type, in, seg, out, x_.stream)
                   : decodeSegments(codec_, x_.type, in, seg, out);
  }
  Status exchange(const Parts& p, const Segments& seg) {
    return c_.allToAll(p.send, p.recv, seg.segmentBytes, DataType::u8, x_.stream);
  }

  Status reduceScatter() {
    const Segments seg = Segments::of(codec_, n_, x_.count, x_.count * n_);
    auto p = parts(seg, false, false);
    if (!p) return p.status();
    if (Status s = encode(x_.send, seg, p->send); !s) return s;
    if (Status s = exchange(*p, seg); !s) return s;
    if (device_)
      return sumSegmentsOnDevice(codec_, p->recv, seg, divisor(), x_.type, x_.recv, x_.count,
                                 x_.stream);
    if (Status s = sumSegments(codec_, p->recv, seg, divisor(), p->sums); !s) return s;
    return fromFloats(x_.type, p->sums, x_.count, x_.recv);
  }

  Status allReduce() {
    // Shares of whole blocks, as the selector priced them.
    const Segments seg =
        Segments::of(codec_, n_, shape_.share(x_.count, static_cast<int>(n_)), x_.count);
    auto p = parts(seg, true, true);
    if (!p) return p.status();
    if (Status s = encode(x_.send, seg, p->send); !s) return s;
    if (Status s = exchange(*p, seg); !s) return s;
    // The second quantization: this rank's reduced share, from its f32 sums.
    if (device_) {
      if (Status s = sumEncodeOnDevice(codec_, p->recv, seg, divisor(), p->mine, x_.stream); !s)
        return s;
    } else {
      if (Status s = sumSegments(codec_, p->recv, seg, divisor(), p->sums); !s) return s;
      const Segments one = Segments::of(codec_, 1, seg.padded, seg.padded);
      if (Status s = encodeSegments(codec_, DataType::f32, p->sums, one, p->mine); !s) return s;
    }
    if (Status s = c_.allGather(p->mine, p->gathered, seg.segmentBytes, DataType::u8, x_.stream);
        !s)
      return s;
    return decode(p->gathered, seg, x_.recv);
  }

  Status allGather() {
    const Segments seg = Segments::of(codec_, n_, x_.count, x_.count * n_);
    const Segments mine = Segments::of(codec_, 1, x_.count, x_.count);
    auto p = parts(seg, false, false);
    if (!p) return p.status();
    // p->send holds this rank's share; p->recv everyone's.
    if (Status s = encode(x_.send, mine, p->send); !s) return s;
    if (Status s = c_.allGather(p->send, p->recv, seg.segmentBytes, DataType::u8, x_.stream); !s)
      return s;
    return decode(p->recv, seg, x_.recv);
  }

  Communicator& c_;
  const Codec& codec_;
  const algo::CodecShape& shape_;
  const CompressedCall& x_;
  bool device_;
  std::size_t n_;
};

const char* what(Collective coll) {
  switch (coll) {
    case Collective::allReduce:
      return "weftAllReduceEx";
    case Collective::reduceScatter:
      return "weftReduceScatterEx";
    default:
      return "weftAllGatherEx";
  }
}

}  // namespace

Result<algo::Plan> planCompressible(Communicator& comm, Collective coll, std::size_t count,
                                    DataType type, bool gpu, const weftCompression& compression) {
  if (!compresses(compression) || !compressible(coll, type, RedOp::sum, "plan").isOk())
    return comm.planFor(coll, count, type, gpu);
  const std::size_t bytes =
      std::size_t{algo::segments(coll, comm.size()).message()} * count * sizeOf(type);
  return comm.compressedPlanFor(coll, bytes, codecShapeOf(compression, type),
                                compression.always != 0, gpu);
}

Status runCompressible(Communicator& comm, const CompressedCall& x,
                       const weftCompression& compression, bool asked) {
  if (Status s = comm.check(x.coll, x.send, x.recv, x.count, x.type, 0); !s) return s;
  if (!compresses(compression)) return plain(comm, x);
  if (Status s = compressible(x.coll, x.type, x.op, what(x.coll)); !s)
    return asked ? Status(s.code(),
                          s.message() + " (compression " + compressionName(compression) + ")")
                 : plain(comm, x);
  if (x.count == 0) return plain(comm, x);
  const bool gpu = exec::isDevicePointer(x.send);
  // Buffers on two kinds of memory: the call as it is says what is wrong.
  if (gpu != exec::isDevicePointer(x.recv)) return plain(comm, x);
  auto plan = planCompressible(comm, x.coll, x.count, x.type, gpu, compression);
  if (!plan) return plan.status();
  if (plan->codec.empty()) return plain(comm, x);
  const Codec codec = Codec::from(compression);
  const algo::CodecShape shape = codecShapeOf(compression, x.type);
  Steps steps(comm, codec, shape, x, gpu);
  if (!gpu) {
    if (x.stream != nullptr)
      return Status(Code::invalidUsage, std::string(what(x.coll)) +
                                            ": a stream was given with host buffers (pass NULL)");
    return steps.run();
  }
  return comm.gpuOperation(x.stream, [&] { return steps.run(); });
}

}  // namespace weft::fused::fp8
