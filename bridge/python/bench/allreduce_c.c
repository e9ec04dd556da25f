/*
 * The C side of step_bench.py's per-call comparison: the same in-place
 * float32 allreduce loop as the Python side, straight against libgocoll.
 *
 *   allreduce_c ITERS BYTES...      (ranks from the launcher's environment)
 *
 * Prints one line "RESULT {"<bytes>": <microseconds per call>, ...}", the
 * best of 5 timed loops of ITERS calls (as the Python side does).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gocoll.h"

#define CHECK(call)                                                                   \
  do {                                                                                \
    gocollResult_t rc_ = (call);                                                      \
    if (rc_ != gocollSuccess) {                                                       \
      fprintf(stderr, "%s: %s: %s\n", #call, gocollGetErrorString(rc_),              \
              gocollGetLastError(comm));                                              \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

#define REPEATS 5

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  gocollComm_t comm = NULL;
  if (argc < 3) {
    fprintf(stderr, "usage: %s ITERS BYTES...\n", argv[0]);
    return 2;
  }
  int iters = atoi(argv[1]);
  CHECK(gocollCommInitFromEnv(&comm));
  printf("RESULT {");
  for (int a = 2; a < argc; a++) {
    size_t bytes = strtoull(argv[a], NULL, 10);
    size_t count = bytes / sizeof(float);
    float* buf = malloc(bytes);
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    for (int i = 0; i < iters / 10 + 1; i++)
      CHECK(gocollAllReduce(buf, buf, count, gocollFloat32, gocollSum, comm));
    /* best of REPEATS timed loops: the machine may be shared */
    double us = 1e300;
    for (int rep = 0; rep < REPEATS; rep++) {
      CHECK(gocollBarrier(comm));
      double t0 = now();
      for (int i = 0; i < iters; i++)
        CHECK(gocollAllReduce(buf, buf, count, gocollFloat32, gocollSum, comm));
      double t = (now() - t0) / iters * 1e6;
      if (t < us) us = t;
    }
    printf("%s\"%zu\": %.3f", a > 2 ? ", " : "", bytes, us);
    free(buf);
  }
  printf("}\n");
  CHECK(gocollCommDestroy(comm));
  return 0;
}
