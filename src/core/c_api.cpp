// The C ABI entry points that exist before the runtime: version, error strings, type sizes.
#include <string>

#include "weft/status.hpp"
#include "weft/types.hpp"
#include "weft/weft.h"

namespace {
thread_local std::string gLastError;  // per-thread, like errno: no locking, no sharing
}

extern "C" {

weftResult_t weftGetVersion(int* version) {
  if (version == nullptr) {
    gLastError = "weftGetVersion: version is NULL; pass the address of an int";
    return weftInvalidArgument;
  }
  *version = WEFT_VERSION_CODE;
  return weftSuccess;
}

const char* weftGetErrorString(weftResult_t result) {
  if (static_cast<int>(result) < 0 || result >= weftNumResults) return "unknown result";
  // name() returns views of string literals, which are NUL-terminated.
  return weft::name(static_cast<weft::Code>(result)).data();
}

const char* weftGetLastError(void) {
  return gLastError.c_str();
}

size_t weftTypeSize(weftDataType_t type) {
  if (static_cast<int>(type) < 0 || type >= weftNumDataTypes) return 0;
  return weft::sizeOf(static_cast<weft::DataType>(type));
}

}  // extern "C"
