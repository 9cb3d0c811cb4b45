// Each collective as nccl-tests measures it: the buffers a size means, the bytes its bandwidth
// counts, its bus-bandwidth factor, what every rank's output must hold, and the call itself.
//
//   collective     count column         buffers (elements)           algbw bytes     busbw factor
//   allreduce      size/e               send = recv = count          count*e         2(n-1)/n
//   allgather      base                 send base, recv n*base       n*base*e        (n-1)/n
//   reducescatter  base                 send n*base, recv base       n*base*e        (n-1)/n
//   broadcast      size/e               send = recv = count          count*e         1
//   reduce         size/e               send = recv = count          count*e         1
//   alltoall       base (to each peer)  send = recv = n*base         n*base*e        (n-1)/n
//   sendrecv       size/e               send = recv = count          count*e         1
// with e the element size and base = (size/e)/n rounded down to whole 16-byte lines. The size
// column is the larger buffer in bytes.
#pragma once

#include <cstddef>
#include <vector>

#include "perf/data_check.hpp"
#include "weft/status.hpp"
#include "weft/types.hpp"
#include "weft/weft.h"

namespace weft::perf {

struct Layout {
  std::size_t count = 0;      // what the call takes (per rank or per peer, as the call counts)
  std::size_t sendCount = 0;  // elements of the send buffer
  std::size_t recvCount = 0;  // elements of the receive buffer
  // In place, rank r's send and receive pointers are recvbuff + r * offset (elements).
  std::size_t sendInPlaceStride = 0;
  std::size_t recvInPlaceStride = 0;
  std::size_t bytes(std::size_t elementSize) const {
    return (sendCount > recvCount ? sendCount : recvCount) * elementSize;
  }
};

Layout layoutFor(Collective c, std::size_t bytes, std::size_t elementSize, int nranks);

// As nccl-tests: the timed calls of one size move through the buffers a slice at a time, so that
// a size below -e does not run from cache. Call i (counting from 0) runs at offset at(i) of both
// buffers; weft's calls and a --compare peer's go through the same slices.
struct Rotation {
  std::size_t sliceBytes = 0;
  std::size_t slices = 1;
  std::size_t at(std::size_t call) const { return sliceBytes * (call % slices); }
};

// The rotation of calls that take `callBytes` of buffers sized for `maxBytes` (-e).
Rotation rotationFor(std::size_t callBytes, std::size_t maxBytes);

// Bytes that algbw counts per call, and busbw = algbw * busFactor.
double algBytes(Collective c, const Layout& l, std::size_t elementSize, int nranks);
double busFactor(Collective c, int nranks);

// Whether the in-place run is checked. nccl-tests reports N/A for in-place send/receive: a rank
// would overwrite what it still has to send.
bool checksInPlace(Collective c);

// What rank `rank`'s receive buffer holds after the call (ranges of it; the rest is not looked
// at). In place, send data were filled into the receive buffer at the rank's offset.
std::vector<Expect> expectations(Collective c, const Layout& l, int rank, int nranks, int root,
                                 bool inPlace);

// Whether `rank` fills its send data before a checked run (broadcast: only the root).
bool fillsInput(Collective c, int rank, int root);

// A C ABI result as a Status naming the call and the library's message.
Status checked(weftResult_t r, const char* what);

// One call of the collective on `comm`; on GPU buffers it is enqueued on `stream` (a
// cudaStream_t), on host buffers `stream` is null and the call blocks.
// `compression` (all-reduce, reduce-scatter, all-gather): through the Ex call with it.
Status launch(Collective c, weftComm_t comm, const void* send, void* recv, const Layout& l,
              DataType type, RedOp op, int root, int rank, int nranks, void* stream,
              const weftCompression* compression = nullptr);

// The error that stopped one of `comm`'s enqueued GPU calls, if any (weftCommGetAsyncError).
Status asyncError(weftComm_t comm);

// What weftCommPlan takes for the call: its collective and count, in its type (send/receive:
// the bytes a rank sends, as uint8).
struct PlanQuery {
  weftCollective_t coll;
  std::size_t count;
  weftDataType_t type;
};
PlanQuery planQuery(Collective c, const Layout& l, DataType type);

}  // namespace weft::perf
