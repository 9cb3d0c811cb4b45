/* Without WEFT_NCCL_HOST_MEMORY=1 the NCCL interface fails where NCCL fails: with no usable CUDA
 * device, init returns ncclUnhandledCudaError; with one, a call on host memory returns
 * ncclInvalidArgument. With NCCL_DEBUG=WARN the reason is printed on stderr where it happens
 * (checked here by reading this process's own stderr back). Exit 0 when all of it holds. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int gFailures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    printf("FAILED: %s (last error: %s)\n", what, ncclGetLastError(NULL));
    ++gFailures;
  }
}

int main(void) {
  setenv("NCCL_DEBUG", "warn", 1); /* lowercase, as NCCL accepts it */
  unsetenv("WEFT_NCCL_HOST_MEMORY");
  char path[] = "/tmp/weft-nccl-refuses-XXXXXX";
  const int fd = mkstemp(path);
  const int saved = dup(STDERR_FILENO);
  if (fd < 0 || saved < 0 || dup2(fd, STDERR_FILENO) < 0) return 2;

  ncclUniqueId id;
  expect(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
  ncclComm_t comm = NULL;
  const ncclResult_t init = ncclCommInitRank(&comm, 1, id, 0);
  const char* expected = NULL;
  if (init != ncclSuccess) {
    /* No GPU here: NCCL's error, and ncclCommInitAll's too. */
    expect(init == ncclUnhandledCudaError, "ncclCommInitRank without a GPU: ncclUnhandledCudaError");
    expect(strstr(ncclGetLastError(NULL), "Cuda failure") != NULL, "the reason names the CUDA failure");
    ncclComm_t comms[2];
    expect(ncclCommInitAll(comms, 2, NULL) == ncclUnhandledCudaError,
           "ncclCommInitAll without a GPU: ncclUnhandledCudaError");
    expected = "weft WARN ncclCommInitRank: Cuda failure";
  } else {
    /* A GPU: host buffers are refused as NCCL's pointer check refuses them. */
    float in[16] = {0}, out[16];
    expect(ncclAllReduce(in, out, 16, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidArgument,
           "ncclAllReduce on host memory: ncclInvalidArgument");
    expect(strstr(ncclGetLastError(NULL), "is not a valid pointer") != NULL,
           "the reason names the pointer");
    expect(ncclCommDestroy(comm) == ncclSuccess, "ncclCommDestroy");
    expected = "weft WARN ncclAllReduce: sendbuff";
  }

  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  char text[8192] = "";
  const ssize_t n = pread(fd, text, sizeof text - 1, 0);
  text[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
  fputs(text, stderr);
  expect(strstr(text, expected) != NULL, "NCCL_DEBUG=WARN printed the reason on stderr");
  printf("%s: %d failure(s)\n", init != ncclSuccess ? "no GPU" : "GPU", gFailures);
  return gFailures == 0 ? 0 : 1;
}
