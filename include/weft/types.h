/* weft public C types: data types, reduction ops, status codes, collective kinds.
 * Plain C so that the C ABI (weft.h) and the NCCL shim can share them. */
#ifndef WEFT_TYPES_H_
#define WEFT_TYPES_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  weftFloat64 = 0,
  weftFloat32 = 1,
  weftFloat16 = 2,
  weftBfloat16 = 3,
  weftFloat8e4m3 = 4,
  weftFloat8e5m2 = 5,
  weftInt8 = 6,
  weftUint8 = 7,
  weftInt32 = 8,
  weftUint32 = 9,
  weftInt64 = 10,
  weftUint64 = 11,
  weftNumDataTypes = 12
} weftDataType_t;

typedef enum {
  weftSum = 0,
  weftProd = 1,
  weftMin = 2,
  weftMax = 3,
  weftAvg = 4,
  weftNumRedOps = 5
} weftRedOp_t;

typedef enum {
  weftSuccess = 0,
  weftInvalidArgument = 1,
  weftInvalidUsage = 2,
  weftSystemError = 3,
  weftInternalError = 4,
  weftRemoteError = 5,
  weftTimeout = 6,
  weftUnsupported = 7,
  weftInProgress = 8,
  weftNumResults = 9
} weftResult_t;

typedef enum {
  weftCollAllReduce = 0,
  weftCollAllGather = 1,
  weftCollReduceScatter = 2,
  weftCollBroadcast = 3,
  weftCollReduce = 4,
  weftCollAllToAll = 5,
  weftCollAllToAllv = 6,
  weftCollSendRecv = 7,
  weftNumCollectives = 8
} weftCollective_t;

#ifdef __cplusplus
}
#endif

#endif /* WEFT_TYPES_H_ */
