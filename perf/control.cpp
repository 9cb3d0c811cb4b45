#include "perf/control.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "perf/collective.hpp"

namespace weft::perf {

Result<double> Control::combine(double value, int average) {
  double out = 0;
  weftResult_t r = weftSuccess;
  if (average == 0) {
    r = weftBroadcast(&value, &out, 1, weftFloat64, 0, comm_, nullptr);
  } else {
    const weftRedOp_t op = average == 2 ? weftMin : average == 3 ? weftMax : weftSum;
    r = weftAllReduce(&value, &out, 1, weftFloat64, op, comm_, nullptr);
    if (average == 1) out /= nranks_;
  }
  if (Status s = checked(r, "combining times"); !s) return s;
  return out;
}

Result<double> Control::from(int root, double value) {
  double out = 0;
  if (Status s = checked(weftBroadcast(&value, &out, 1, weftFloat64, root, comm_, nullptr),
                         "broadcasting a measurement");
      !s)
    return s;
  return out;
}

Result<std::int64_t> Control::sum(std::int64_t value) {
  std::int64_t out = 0;
  if (Status s = checked(weftAllReduce(&value, &out, 1, weftInt64, weftSum, comm_, nullptr),
                         "summing wrong elements");
      !s)
    return s;
  return out;
}

Status Control::barrier() {
  return checked(weftBarrier(comm_, nullptr), "weftBarrier");
}

Status Control::broadcast(void* bytes, std::size_t n) {
  return checked(weftBroadcast(bytes, bytes, n, weftUint8, 0, comm_, nullptr),
                 "broadcasting a unique id");
}

Result<std::vector<std::string>> Control::gather(const std::string& line) {
  constexpr std::size_t kWidth = 256;
  std::vector<char> mine(kWidth, '\0'), all(kWidth * static_cast<std::size_t>(nranks_));
  std::memcpy(mine.data(), line.data(), std::min(line.size(), kWidth - 1));
  if (Status s = checked(weftAllGather(mine.data(), all.data(), kWidth, weftUint8, comm_, nullptr),
                         "gathering rank lines");
      !s)
    return s;
  std::vector<std::string> out;
  for (int r = 0; r < nranks_; ++r) out.emplace_back(all.data() + r * kWidth);
  return out;
}

std::optional<std::string> environment(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::optional<std::string>(v) : std::nullopt;
}

void setEnvironment(const char* name, const std::optional<std::string>& value) {
  if (value) {
    setenv(name, value->c_str(), 1);
  } else {
    unsetenv(name);
  }
}

Result<Comm> joinWithEnvironment(ProcessContext& context, int thread, int rank, int nranks,
                                 Control& control,
                                 const std::vector<EnvironmentSetting>& settings) {
  std::vector<std::optional<std::string>> saved;
  auto restore = [&] {
    if (thread != 0) return;
    for (std::size_t i = 0; i < saved.size(); ++i)
      setEnvironment(settings[i].first.c_str(), saved[i]);
  };
  context.threads->arrive_and_wait();
  weftUniqueId id{};
  Status made;
  if (thread == 0) {
    for (const auto& [name, value] : settings) {
      saved.push_back(environment(name.c_str()));
      setEnvironment(name.c_str(), value);
    }
  }
  if (rank == 0) {
    // WEFT_COMM_ID names one fixed rendezvous, which the first communicator used up.
    const auto commId = environment("WEFT_COMM_ID"), ncclId = environment("NCCL_COMM_ID");
    unsetenv("WEFT_COMM_ID");
    unsetenv("NCCL_COMM_ID");
    made = checked(weftGetUniqueId(&id), "weftGetUniqueId");
    setEnvironment("WEFT_COMM_ID", commId);
    setEnvironment("NCCL_COMM_ID", ncclId);
  }
  context.threads->arrive_and_wait();
  if (!made) {
    restore();
    return made;
  }
  if (Status s = control.broadcast(&id, sizeof id); !s) {
    restore();
    return s;
  }
  auto comm = Comm::initRank(nranks, UniqueId{id}, rank);
  // Every rank of this process has read the environment before thread 0 restores it.
  context.threads->arrive_and_wait();
  restore();
  return comm;
}

}  // namespace weft::perf
