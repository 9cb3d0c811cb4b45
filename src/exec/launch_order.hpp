// The order of one communicator's operations on the GPU: each runs after the one issued before
// it on that communicator, whatever stream it was issued on, inside or outside CUDA graph capture,
// as NCCL orders a communicator's operations. Its kernels share the communicator's FIFOs, counts
// and scratch, so two of them running at once (on two streams) would take each other's messages.
// Nothing here blocks the host:
//  - outside capture, an operation's stream waits for the event the previous one recorded (a
//    wait skipped on the same stream, unless a graph may have recorded the event since);
//  - in capture, the capture's first operation waits on that event at every replay (an external
//    wait node), the capture's later ones depend on the previous one's nodes, and one record
//    node per capture, kept after the newest operation, records the event for what comes after
//    a replay.
// Host-includable: no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "weft/status.hpp"

namespace weft::exec {

class LaunchOrder {
 public:
  // On the current device (the communicator's). mixing: graphs are ordered against eager
  // operations and other graphs too (the external wait and record nodes); without it a graph's
  // operations are ordered among themselves only (NCCL_GRAPH_MIXING_SUPPORT=0).
  static Result<std::unique_ptr<LaunchOrder>> create(bool mixing = true);
  ~LaunchOrder();
  LaunchOrder(const LaunchOrder&) = delete;
  LaunchOrder& operator=(const LaunchOrder&) = delete;

  // Before an operation's first launch on `stream` (a cudaStream_t), and after its last.
  Status begin(void* stream);
  Status end(void* stream);
  // Waits for the operations issued outside capture.
  Status synchronize();
  // Whether begin() made this operation wait for its predecessor (an event wait, or in capture
  // a wait node or another stream's nodes): its kernels then follow that, not the stream's
  // previous kernel, and launch plainly rather than as programmatic dependents of it.
  bool waited() const { return waited_; }

 private:
  LaunchOrder() = default;
  // What one capture sequence holds of this communicator's operations.
  struct Capture {
    void* stream = nullptr;   // cudaStream_t of its newest operation
    std::vector<void*> tail;  // cudaGraphNode_t: that operation's last nodes
    void* record = nullptr;   // cudaGraphNode_t: the record node of done_, after the tail
    std::uint64_t used = 0;   // when it last took an operation (pruning)
  };
  void* done_ = nullptr;  // cudaEvent_t: recorded after every operation
  bool issued_ = false;   // some operation recorded done_ outside capture
  bool mixing_ = true;
  bool everCaptured_ = false;      // replays may record done_ on any stream
  unsigned long long stream_ = 0;  // the stream of the newest operation outside capture
  bool pending_ = false;           // done_ recorded since the last synchronize()
  bool waited_ = false;            // the current operation waits for its predecessor
  std::map<unsigned long long, Capture> captures_;  // by capture sequence id
  std::uint64_t operations_ = 0;
};

}  // namespace weft::exec
