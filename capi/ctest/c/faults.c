/* Failure scenarios, each run by a Go test with several ranks joined through
 * torchrun-style environment variables:
 *
 *   faults kill      every rank allreduces in a loop and prints "READY"
 *                    after a few rounds; the test SIGKILLs one rank, and the
 *                    others must get gocollRemoteError (or gocollTimeout)
 *                    instead of hanging.
 *   faults abort     2 ranks. Rank 1 starts a gocollIAllReduce (and, on a
 *                    second thread, a blocking gocollBarrier) that rank 0
 *                    never joins; gocollCommAbort must unblock both at
 *                    once. Rank 0 then calls the allreduce (which may
 *                    still complete with the data rank 1 sent before it
 *                    aborted) and a second one, which must fail with
 *                    gocollRemoteError.
 *   faults mismatch  2 ranks call gocollAllReduce with different counts.
 *   faults vmismatch 2 ranks call gocollAllToAllv, rank 1 expecting one
 *                    element less from rank 0 than it sends: both must
 *                    fail with gocollInvalidUsage and leave the block from
 *                    the peer unwritten.
 *   faults loop      allreduces with every result checked, prints "READY"
 *                    after 10 calls, until rank 0 finds the file named by
 *                    GOCOLL_TEST_STOP (its decision travels in the
 *                    allreduce, so every rank stops after the same call);
 *                    prints "DONE calls=N". The test meanwhile attacks the
 *                    job's ports.
 *   faults init      only gocollCommInitFromEnv; prints its result code
 *                    (the test sets up a rendezvous that fails: a rank
 *                    missing, sizes that disagree, a wrong secret) and
 *                    exits 0 whatever it was.
 *
 * Each prints "RESULT ..." lines the test reads, and exits 0 only when the
 * codes are the expected ones. */
#include <pthread.h>
#include <unistd.h>

#include "common.h"

static gocollComm_t comm;

static int run_kill(void) {
  enum { N = 1 << 14 };
  static float buf[N];
  double start = now_seconds();
  long iter;
  gocollResult_t rc = gocollSuccess, async = gocollSuccess, again;
  for (iter = 0; now_seconds() - start < 60; iter++) {
    int i;
    for (i = 0; i < N; i++) buf[i] = (float)g_rank;
    rc = gocollAllReduce(buf, buf, N, gocollFloat32, gocollSum, comm);
    if (rc != gocollSuccess) break;
    if (iter == 3) {
      printf("READY\n");
      fflush(stdout);
    }
  }
  if (rc == gocollSuccess) {
    printf("NOERROR after %ld iterations\n", iter);
    return 6;
  }
  printf("RESULT code=%d iter=%ld err=%s\n", (int)rc, iter, gocollGetLastError(comm));
  CHECK_COMM(gocollCommGetAsyncError(comm, &async), comm);
  again = gocollAllReduce(buf, buf, N, gocollFloat32, gocollSum, comm);
  printf("AFTER async=%d again=%d err=%s\n", (int)async, (int)again, gocollGetLastError(comm));
  fflush(stdout);
  gocollCommDestroy(comm);
  printf("DESTROYED\n");
  if (rc != gocollRemoteError && rc != gocollTimeout) return 5;
  if (async == gocollSuccess || again != gocollInvalidUsage) return 5;
  return 0;
}

static gocollResult_t barrier_rc = gocollInternalError;

static void* blocked_barrier(void* arg) {
  (void)arg;
  barrier_rc = gocollBarrier(comm);
  return NULL;
}

static int run_abort(void) {
  float buf[64] = {0};
  if (g_rank == 1) {
    gocollRequest_t req = NULL;
    pthread_t th;
    int done = 0;
    double t;
    gocollResult_t wait_rc;
    CHECK_COMM(gocollIAllReduce(buf, buf, 64, gocollFloat32, gocollSum, comm, &req), comm);
    pthread_create(&th, NULL, blocked_barrier, NULL);
    sleep_ms(300);
    CHECK_COMM(gocollTest(req, &done), comm);
    if (done) FAIL("allreduce finished although rank 0 never joined");
    t = now_seconds();
    CHECK(gocollCommAbort(comm));
    pthread_join(th, NULL);
    wait_rc = gocollWait(req);
    t = now_seconds() - t;
    printf("RESULT rank=1 wait=%d barrier=%d seconds=%.3f err=%s\n", (int)wait_rc, (int)barrier_rc, t,
           gocollGetLastError(NULL));
    if (wait_rc != gocollInvalidUsage || barrier_rc != gocollInvalidUsage || t > 5) return 5;
    /* Stay until rank 0 saw the abort (it reads it from our connection). */
    sleep_ms(2500);
    return 0;
  } else {
    gocollResult_t rc = gocollSuccess;
    int i;
    sleep_ms(1500);
    /* The first allreduce may still succeed: rank 1 had sent its part
     * before it aborted. The next one cannot. */
    for (i = 0; i < 3 && rc == gocollSuccess; i++) rc = gocollAllReduce(buf, buf, 64, gocollFloat32, gocollSum, comm);
    printf("RESULT rank=%d allreduce=%d calls=%d err=%s\n", g_rank, (int)rc, i, gocollGetLastError(comm));
    gocollCommDestroy(comm);
    return rc == gocollRemoteError ? 0 : 5;
  }
}

static int run_loop(void) {
  enum { N = 4096 };
  static float buf[N + 1];
  const char* stop = getenv("GOCOLL_TEST_STOP");
  int n = 0, i;
  long call;
  CHECK_COMM(gocollCommCount(comm, &n), comm);
  for (call = 0;; call++) {
    for (i = 0; i < N; i++) buf[i] = (float)((g_rank + 1) * ((call + i) % 7 + 1));
    buf[N] = (g_rank == 0 && stop != NULL && access(stop, F_OK) == 0) ? 1.0f : 0.0f;
    CHECK_COMM(gocollAllReduce(buf, buf, N + 1, gocollFloat32, gocollSum, comm), comm);
    for (i = 0; i < N; i++) {
      float want = (float)(n * (n + 1) / 2 * ((call + i) % 7 + 1));
      if (buf[i] != want) FAIL("call %ld: element %d is %g, want %g", call, i, buf[i], want);
    }
    if (call == 10) {
      printf("READY\n");
      fflush(stdout);
    }
    if (buf[N] != 0) break;
  }
  printf("DONE calls=%ld\n", call + 1);
  fflush(stdout);
  CHECK(gocollCommDestroy(comm));
  return 0;
}

static int run_mismatch(void) {
  float buf[8] = {0};
  gocollResult_t rc = gocollAllReduce(buf, buf, g_rank == 0 ? 4 : 5, gocollFloat32, gocollSum, comm);
  printf("RESULT rank=%d allreduce=%d err=%s\n", g_rank, (int)rc, gocollGetLastError(comm));
  gocollCommDestroy(comm);
  return rc == gocollInvalidUsage || rc == gocollRemoteError ? 0 : 5;
}

static int run_vmismatch(void) {
  float send[4], recv[4];
  size_t sc[2] = {2, 2}, sd[2] = {0, 2}, rc[2] = {2, 2}, rd[2] = {0, 2};
  int i, peer = 1 - g_rank, untouched = 1;
  for (i = 0; i < 4; i++) send[i] = (float)(g_rank * 10 + i), recv[i] = -1.0f;
  if (g_rank == 1) rc[0] = 1;
  gocollResult_t r = gocollAllToAllv(send, sc, sd, recv, rc, rd, gocollFloat32, comm);
  for (i = 0; i < (int)rc[peer]; i++)
    if (recv[rd[peer] + i] != -1.0f) untouched = 0;
  printf("RESULT rank=%d alltoallv=%d untouched=%d err=%s\n", g_rank, (int)r, untouched, gocollGetLastError(comm));
  gocollCommDestroy(comm);
  return r == gocollInvalidUsage && untouched ? 0 : 5;
}

int main(int argc, char** argv) {
  setvbuf(stderr, NULL, _IONBF, 0);
  if (argc < 2) {
    fprintf(stderr, "usage: %s kill|abort|mismatch|vmismatch|loop|init\n", argv[0]);
    return 64;
  }
  if (strcmp(argv[1], "init") == 0) {
    gocollResult_t rc = gocollCommInitFromEnv(&comm);
    printf("RESULT init=%d err=%s\n", (int)rc, rc == gocollSuccess ? "" : gocollGetLastError(NULL));
    if (rc == gocollSuccess) gocollCommDestroy(comm);
    return 0;
  }
  CHECK(gocollCommInitFromEnv(&comm));
  CHECK_COMM(gocollCommUserRank(comm, &g_rank), comm);
  if (strcmp(argv[1], "kill") == 0) return run_kill();
  if (strcmp(argv[1], "abort") == 0) return run_abort();
  if (strcmp(argv[1], "mismatch") == 0) return run_mismatch();
  if (strcmp(argv[1], "vmismatch") == 0) return run_vmismatch();
  if (strcmp(argv[1], "loop") == 0) return run_loop();
  fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 64;
}
