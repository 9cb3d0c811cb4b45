// Argument checks shared by the communicator's calls (src/core/arguments.cpp).
#pragma once

#include <cstddef>

#include "weft/status.hpp"
#include "weft/types.hpp"

namespace weft {

// Null buffers where count > 0 needs them.
Status checkBuffers(const char* what, const void* send, const void* recv, std::size_t count,
                    bool needSend, bool needRecv);
// count elements of `type` per segment, `segments` of them, at most PTRDIFF_MAX bytes.
Status checkCount(const char* what, std::size_t count, std::size_t segments, DataType type);
// A buffer of `bytes` at `at` ends inside the address space.
Status checkSpan(const char* what, const char* buffer, const void* at, std::size_t bytes);

}  // namespace weft
