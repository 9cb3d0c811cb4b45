# libweft_nccl.so is a drop-in libnccl.so.2: that SONAME, every function NCCL 2.28 declares as a
# strong pnccl* and a weak nccl*, no other symbol of its own (weft's are hidden), and, given
# REAL (NCCL's own libnccl.so.2), every symbol that one exports (PyTorch binds its device API's
# at load).
execute_process(COMMAND readelf -d ${LIB} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT dynamic MATCHES "Library soname: \\[libnccl\\.so\\.2\\]")
  message(FATAL_ERROR "${LIB}: SONAME is not libnccl.so.2:\n${dynamic}")
endif()
execute_process(COMMAND readelf --dyn-syms -W ${LIB} OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf --dyn-syms ${LIB} failed")
endif()
set(functions
    GetVersion GetErrorString GetLastError GetUniqueId CommInitRank CommInitRankConfig
    CommInitRankScalable CommInitAll CommSplit CommShrink CommFinalize CommDestroy CommAbort
    CommRevoke CommGetAsyncError CommCount CommCuDevice CommUserRank CommRegister CommDeregister
    CommWindowRegister CommWindowDeregister MemAlloc MemFree RedOpCreatePreMulSum RedOpDestroy
    AllReduce AllGather ReduceScatter Broadcast Bcast Reduce AlltoAll Gather Scatter Send Recv
    GroupStart GroupEnd GroupSimulateEnd DevCommCreate DevCommDestroy
    LsaBarrierCreateRequirement GinBarrierCreateRequirement LLA2ACreateRequirement
    LLA2ACalcSlots TeamWorld TeamLsa TeamRail TeamRankToWorld TeamRankToLsa ResetDebugInit)
foreach(f ${functions})
  if(NOT syms MATCHES "FUNC +GLOBAL +DEFAULT +[0-9]+ pnccl${f}\n")
    message(FATAL_ERROR "${LIB}: pnccl${f} is not exported as a global function")
  endif()
  if(NOT syms MATCHES "FUNC +WEAK +DEFAULT +[0-9]+ nccl${f}\n")
    message(FATAL_ERROR "${LIB}: nccl${f} is not exported as a weak function")
  endif()
endforeach()
string(REGEX MATCHALL "(GLOBAL|WEAK) +DEFAULT +[0-9]+ [A-Za-z_][A-Za-z0-9_]*" defined "${syms}")
foreach(d ${defined})
  string(REGEX REPLACE ".* " "" name "${d}")
  if(NOT name MATCHES "^p?nccl")
    message(FATAL_ERROR "${LIB} exports ${name}, which is not NCCL's")
  endif()
endforeach()
list(LENGTH functions n)
set(also "")
if(REAL AND EXISTS "${REAL}")
  execute_process(COMMAND readelf --dyn-syms -W ${REAL} OUTPUT_VARIABLE real RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readelf --dyn-syms ${REAL} failed")
  endif()
  # Defined (not UND) global or weak symbols: the section index is a number.
  string(REGEX MATCHALL "(GLOBAL|WEAK) +DEFAULT +[0-9]+ [A-Za-z_][A-Za-z0-9_]*" theirs "${real}")
  set(count 0)
  foreach(d ${theirs})
    string(REGEX REPLACE ".* " "" name "${d}")
    if(NOT syms MATCHES "(GLOBAL|WEAK) +DEFAULT +[0-9]+ ${name}\n")
      message(FATAL_ERROR "${LIB} does not export ${name}, which ${REAL} does")
    endif()
    math(EXPR count "${count} + 1")
  endforeach()
  set(also ", and all ${count} symbols of ${REAL}")
endif()
message(STATUS "${LIB}: SONAME libnccl.so.2, ${n} functions as pnccl* and weak nccl*${also}")
