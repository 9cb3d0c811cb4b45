/* weft C ABI. Every function returns a weftResult_t; no exception crosses this boundary.
 * The communicator and collective entry points join this header with the host runtime. */
#ifndef WEFT_WEFT_H_
#define WEFT_WEFT_H_

#include <stddef.h>

#include "weft/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0
#define WEFT_VERSION_CODE \
  (WEFT_VERSION_MAJOR * 10000 + WEFT_VERSION_MINOR * 100 + WEFT_VERSION_PATCH)

/* The library's version as MAJOR*10000 + MINOR*100 + PATCH. */
weftResult_t weftGetVersion(int* version);

/* A static, human-readable name for a result code ("invalid argument"). Never NULL. */
const char* weftGetErrorString(weftResult_t result);

/* The message of the last failed call on this thread ("" if none). */
const char* weftGetLastError(void);

/* Bytes of one element of the type; 0 for an invalid type. */
size_t weftTypeSize(weftDataType_t type);

#ifdef __cplusplus
}
#endif

#endif /* WEFT_WEFT_H_ */
