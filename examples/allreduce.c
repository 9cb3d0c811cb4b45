/* The C API: four ranks as threads of one process, each all-reducing its vector on host memory.
 * Build: cc allreduce.c $(pkg-config --cflags --libs weft) -pthread. Built and run by the tests. */
#include <pthread.h>
#include <stdio.h>

#include "weft/weft.h"

enum { kRanks = 4, kCount = 1 << 16 };

struct rank {
  weftComm_t comm;
  float x[kCount], sum[kCount];
  int ok;
};

static void* run(void* arg) {
  struct rank* r = arg;
  int me = 0;
  weftCommUserRank(r->comm, &me);
  for (int i = 0; i < kCount; ++i) r->x[i] = (float)me;
  const weftResult_t s = weftAllReduce(r->x, r->sum, kCount, weftFloat32, weftSum, r->comm, NULL);
  r->ok = s == weftSuccess && r->sum[kCount - 1] == kRanks * (kRanks - 1) / 2;
  printf("rank %d: %s\n", me, s == weftSuccess ? (r->ok ? "ok" : "wrong sum") : weftGetLastError());
  return NULL;
}

int main(void) {
  static struct rank ranks[kRanks];
  weftComm_t comms[kRanks];
  if (weftCommInitAll(comms, kRanks) != weftSuccess) {
    fprintf(stderr, "weftCommInitAll: %s\n", weftGetLastError());
    return 1;
  }
  pthread_t threads[kRanks];
  for (int i = 0; i < kRanks; ++i) {
    ranks[i].comm = comms[i];
    pthread_create(&threads[i], NULL, run, &ranks[i]);
  }
  int ok = 1;
  for (int i = 0; i < kRanks; ++i) {
    pthread_join(threads[i], NULL);
    ok = ok && ranks[i].ok;
    weftCommDestroy(comms[i]);
  }
  int version = 0;
  weftGetVersion(&version);
  printf("weft %d: %s\n", version, ok ? "all ranks ok" : "FAILED");
  return ok ? 0 : 1;
}
