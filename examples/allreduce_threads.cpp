// Four ranks as threads of one process, each all-reducing its vector on host memory. With
// processes instead, rank 0 makes a weft::UniqueId, shares it (MPI_Bcast, a file), and every
// rank calls weft::Comm::initRank(nranks, id, rank). Built and run by the tests.
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "weft/weft.hpp"

int main() {
  constexpr int kRanks = 4;
  auto comms = weft::Comm::initAll(kRanks);
  if (!comms) return std::fprintf(stderr, "%s\n", comms.status().toString().c_str()), 1;
  std::atomic<int> wrong = 0;
  std::vector<std::thread> ranks;
  for (weft::Comm& comm : *comms) {
    ranks.emplace_back([&comm, &wrong] {
      std::vector<float> x(1 << 20, float(comm.rank())), sum(x.size());
      weft::Status s = comm.allReduce(x.data(), sum.data(), x.size(), weft::RedOp::sum);
      const float expected = kRanks * (kRanks - 1) / 2;
      if (!s.isOk() || sum.back() != expected) ++wrong;
      std::printf("rank %d: %s, sum[0] = %g (expected %g)\n", comm.rank(),
                  s.isOk() ? "ok" : s.toString().c_str(), sum[0], expected);
    });
  }
  for (std::thread& t : ranks) t.join();
  std::printf("%s\n", (*comms)[0].summary().c_str());
  return wrong == 0 ? 0 : 1;
}
