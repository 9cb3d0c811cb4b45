// --compare mpi: each collective through MPI's own call on MPI_COMM_WORLD.
//   allreduce MPI_Allreduce, allgather MPI_Allgather, reducescatter MPI_Reduce_scatter_block,
//   broadcast MPI_Bcast, reduce MPI_Reduce, alltoall MPI_Alltoall, sendrecv MPI_Sendrecv around
//   the same ring. avg runs as MPI_SUM (MPI has no average; the division is not timed). Types MPI
//   lacks (f16, bf16, fp8) are timed as same-size integers when the call only copies, and not at
//   all when it reduces.
#include "perf/peer.hpp"

#ifdef WEFT_HAVE_MPI
#include <mpi.h>

#include <climits>

namespace weft::perf {
namespace {

std::optional<MPI_Datatype> mpiType(DataType t, bool reduces) {
  switch (t) {
    case DataType::f64:
      return MPI_DOUBLE;
    case DataType::f32:
      return MPI_FLOAT;
    case DataType::i8:
      return MPI_INT8_T;
    case DataType::u8:
      return MPI_UINT8_T;
    case DataType::i32:
      return MPI_INT32_T;
    case DataType::u32:
      return MPI_UINT32_T;
    case DataType::i64:
      return MPI_INT64_T;
    case DataType::u64:
      return MPI_UINT64_T;
    case DataType::f16:
    case DataType::bf16:
      if (reduces) return std::nullopt;
      return MPI_UINT16_T;
    case DataType::f8e4m3:
    case DataType::f8e5m2:
      if (reduces) return std::nullopt;
      return MPI_UINT8_T;
  }
  return std::nullopt;
}

MPI_Op mpiOp(RedOp op) {
  switch (op) {
    case RedOp::prod:
      return MPI_PROD;
    case RedOp::min:
      return MPI_MIN;
    case RedOp::max:
      return MPI_MAX;
    case RedOp::sum:
    case RedOp::avg:
      break;
  }
  return MPI_SUM;
}

class MpiPeer final : public Peer {
 public:
  std::string name() const override { return "mpi"; }

  std::optional<double> secondsPerCall(Collective c, const Layout& l, DataType type, RedOp op,
                                       int root, const void* send, void* recv,
                                       const Rotation& rotation, int warmup, int iters,
                                       int /*graphLaunches*/) override {
    const auto t = mpiType(type, isReduction(c));
    if (!t || l.count > static_cast<std::size_t>(INT_MAX)) return std::nullopt;
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int n = static_cast<int>(l.count);
    const MPI_Op o = mpiOp(op);
    auto call = [&](std::size_t shift) {
      // MPI-3 takes const; older headers do not
      void* in = const_cast<std::byte*>(static_cast<const std::byte*>(send)) + shift;
      void* out = static_cast<std::byte*>(recv) + shift;
      switch (c) {
        case Collective::allReduce:
          return MPI_Allreduce(in, out, n, *t, o, MPI_COMM_WORLD);
        case Collective::allGather:
          return MPI_Allgather(in, n, *t, out, n, *t, MPI_COMM_WORLD);
        case Collective::reduceScatter:
          return MPI_Reduce_scatter_block(in, out, n, *t, o, MPI_COMM_WORLD);
        case Collective::broadcast:
          return MPI_Bcast(rank == root ? in : out, n, *t, root, MPI_COMM_WORLD);
        case Collective::reduce:
          return MPI_Reduce(in, out, n, *t, o, root, MPI_COMM_WORLD);
        case Collective::allToAll:
        case Collective::allToAllv:
          return MPI_Alltoall(in, n, *t, out, n, *t, MPI_COMM_WORLD);
        case Collective::sendRecv:
          break;
      }
      return MPI_Sendrecv(in, n, *t, (rank + 1) % size, 0, out, n, *t, (rank + size - 1) % size, 0,
                          MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    };
    for (int i = 0; i < warmup; ++i) {
      if (call(0) != MPI_SUCCESS) return std::nullopt;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      if (call(rotation.at(static_cast<std::size_t>(i))) != MPI_SUCCESS) return std::nullopt;
    }
    return (MPI_Wtime() - start) / iters;
  }
};

}  // namespace

std::unique_ptr<Peer> makeMpiPeer() {
  return std::make_unique<MpiPeer>();
}

}  // namespace weft::perf

#else

namespace weft::perf {

std::unique_ptr<Peer> makeMpiPeer() {
  return nullptr;
}

}  // namespace weft::perf

#endif
