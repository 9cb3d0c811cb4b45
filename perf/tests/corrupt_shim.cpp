// Preloaded into weft-perf (LD_PRELOAD) by the tests: passes weftAllReduce through to libweft,
// then flips one bit of rank 1's float output, so the test can see that weft-perf's check
// counts the element, prints FAILED and exits with 1. The harness's own all-reduces (one f64
// or i64 element) pass untouched.
#include <dlfcn.h>

#include "weft/weft.h"

extern "C" weftResult_t weftAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                      weftDataType_t datatype, weftRedOp_t op, weftComm_t comm,
                                      void* stream) {
  using Fn =
      weftResult_t (*)(const void*, void*, size_t, weftDataType_t, weftRedOp_t, weftComm_t, void*);
  static const auto real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "weftAllReduce"));
  const weftResult_t r = real(sendbuff, recvbuff, count, datatype, op, comm, stream);
  int rank = -1;
  if (r == weftSuccess && datatype == weftFloat32 && count > 1 &&
      weftCommUserRank(comm, &rank) == weftSuccess && rank == 1) {
    static_cast<unsigned char*>(recvbuff)[count * 4 - 1] ^= 0x40;
  }
  return r;
}
