// The host reduction compiled for avx512 (flags in src/CMakeLists.txt).
#define WEFT_REDUCE_ISA avx512
#define WEFT_NUMERIC_NS avx512
#include "src/exec/host_reduce_impl.hpp"
