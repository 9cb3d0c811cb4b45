// The host reduction compiled for avx2 (flags in src/CMakeLists.txt).
#define WEFT_REDUCE_ISA avx2
#define WEFT_NUMERIC_NS avx2
#include "src/exec/host_reduce_impl.hpp"
