/* Surviving a lost rank through the C ABI, run by elastic_test.go:
 *
 *   elastic shrink  4 ranks (torchrun-style variables) allreduce with every
 *                   result checked and print "READY"; the test SIGKILLs
 *                   rank GOCOLL_TEST_VICTIM. The others must get
 *                   gocollRemoteError or gocollTimeout, then
 *                   gocollCommShrink(comm, NULL, 0, &newcomm, NULL,
 *                   GOCOLL_SHRINK_ABORT) gives 3 ranks, gocollCommGetFailed
 *                   names the victim, and checked allreduces go on. New
 *                   rank 0 writes the join info to GOCOLL_TEST_JOINFILE;
 *                   each step carries rank 0's gocollCommJoiners count, and
 *                   once a process waits all call gocollCommGrow: 4 ranks
 *                   again, 20 checked allreduces, "SUMS OK".
 *   elastic vrecover 8 virtual devices (ring) over the ranks train a shared
 *                   vector w (gocollVCommRegisterShared) for 40 steps:
 *                   per-device gradients of (device, step), averaged by
 *                   gocollVAllReduce, w -= 0.1 * avg. After step 10 it
 *                   prints "READY"; rank GOCOLL_TEST_VICTIM (if set) then
 *                   waits to be SIGKILLed. The others shrink
 *                   (GOCOLL_SHRINK_ABORT), check that a recovery onto too
 *                   few ranks is refused (gocollInvalidUsage), then
 *                   gocollVCommRecover and go on; all print "W <checksum>"
 *                   of the final bytes, which must match an uninterrupted
 *                   run's.
 *                   Between: a recovery with minRanks differing between the
 *                   ranks must be refused on every rank
 *                   (gocollInvalidArgument).
 *   elastic scale   any number of ranks allreduce with every result checked;
 *                   at call 5 rank GOCOLL_TEST_VICTIM SIGKILLs itself (-1:
 *                   none; the test may kill or stop ranks itself). The
 *                   others shrink as above and must land in one
 *                   communicator of GOCOLL_TEST_EXPECT ranks (default
 *                   n-1; with one victim its rank and the failed list are
 *                   checked too), print "SHRUNK size=... ms=...", run 5
 *                   checked allreduces on it and print "SUMS OK". A rank
 *                   the shrink leaves out prints "OUT code=..." and exits
 *                   0: the test says who may.
 *   elastic noquorum 4 ranks allreduce and print "READY"; ranks 1 and 2
 *                   then wait for the test to stop them (SIGSTOP: silent,
 *                   not dead). The two left must get gocollNoQuorum from
 *                   gocollCommShrink under the majority quorum (not a peer
 *                   failure to retry) and print "NOQUORUM".
 *   elastic join    the replacement: waits for the join file, then
 *                   gocollCommJoin (secret from GOCOLL_SECRET) and the same
 *                   20 checked allreduces.
 */
#include <signal.h>
#include <unistd.h>

#include "common.h"

enum { N = 4096 };
static float buf[N + 1];

/* One checked allreduce of step `call` on c; extra travels in the last
 * element (summed). Returns the call's result code. */
static gocollResult_t checked(gocollComm_t c, long call, float extra, float* total) {
  int n = 0, rank = 0, i;
  gocollResult_t rc;
  CHECK_COMM(gocollCommCount(c, &n), c);
  CHECK_COMM(gocollCommUserRank(c, &rank), c);
  for (i = 0; i < N; i++) buf[i] = (float)((rank + 1) * ((call + i) % 7 + 1));
  buf[N] = extra;
  rc = gocollAllReduce(buf, buf, N + 1, gocollFloat32, gocollSum, c);
  if (rc != gocollSuccess) return rc;
  for (i = 0; i < N; i++) {
    float want = (float)(n * (n + 1) / 2 * ((call + i) % 7 + 1));
    if (buf[i] != want) FAIL("call %ld: element %d is %g, want %g", call, i, buf[i], want);
  }
  if (total) *total = buf[N];
  return gocollSuccess;
}

static void last_steps(gocollComm_t c) {
  long call;
  for (call = 0; call < 20; call++) CHECK_COMM(checked(c, call, 0, NULL), c);
  printf("SUMS OK\n");
  fflush(stdout);
}

/* Checked allreduces on comm until one fails; after call 10 it prints
 * "READY" (a rank with stay set then waits to be killed). Returns the
 * failed call's result code. */
static gocollResult_t until_failure(gocollComm_t comm, int stay) {
  gocollResult_t rc = gocollSuccess;
  long call;
  for (call = 0; rc == gocollSuccess; call++) {
    rc = checked(comm, call, 0, NULL);
    if (call == 10) {
      printf("READY\n");
      fflush(stdout);
      if (stay)
        for (;;) sleep_ms(1000); /* the test kills it; it never takes part in the shrink */
    }
  }
  return rc;
}

static int run_shrink(void) {
  gocollComm_t comm = NULL, small = NULL, grown = NULL;
  gocollResult_t rc = gocollSuccess;
  const char* joinfile = getenv("GOCOLL_TEST_JOINFILE");
  int victim = atoi(getenv("GOCOLL_TEST_VICTIM")), n = 0, rank = 0, failed[8], nfailed = 0;
  long call;
  double t0;
  CHECK(gocollCommInitFromEnv(&comm));
  CHECK_COMM(gocollCommUserRank(comm, &g_rank), comm);
  rc = until_failure(comm, 0);
  printf("FAILED code=%d err=%s\n", (int)rc, gocollGetLastError(comm));
  if (rc != gocollRemoteError && rc != gocollTimeout) FAIL("allreduce failed with %d", (int)rc);
  t0 = now_seconds();
  CHECK_COMM(gocollCommShrink(comm, NULL, 0, &small, NULL, GOCOLL_SHRINK_ABORT), comm);
  CHECK_COMM(gocollCommCount(small, &n), small);
  CHECK_COMM(gocollCommUserRank(small, &rank), small);
  CHECK_COMM(gocollCommGetFailed(comm, failed, 8, &nfailed), comm);
  printf("SHRUNK size=%d rank=%d ms=%.1f failed=%d:%d\n", n, rank, (now_seconds() - t0) * 1e3, nfailed,
         nfailed > 0 ? failed[0] : -1);
  fflush(stdout);
  if (n != 3 || rank != g_rank - (g_rank > victim)) FAIL("shrunk to rank %d of %d", rank, n);
  if (nfailed != 1 || failed[0] != victim) FAIL("gocollCommGetFailed: %d ranks, first %d", nfailed, failed[0]);
  /* The old communicator is revoked: its calls say so. */
  if ((rc = gocollAllReduce(buf, buf, 1, gocollFloat32, gocollSum, comm)) != gocollRevoked)
    FAIL("allreduce on the revoked communicator: %d", (int)rc);
  if (rank == 0) {
    char info[512], tmp[600];
    FILE* f;
    CHECK_COMM(gocollCommJoinInfo(small, info, sizeof info, NULL), small);
    snprintf(tmp, sizeof tmp, "%s.tmp", joinfile);
    f = fopen(tmp, "w");
    if (!f || fputs(info, f) < 0 || fclose(f) != 0 || rename(tmp, joinfile) != 0) FAIL("writing %s", joinfile);
  }
  /* Steps go on; each carries how many processes wait to join. */
  t0 = now_seconds();
  for (call = 0;; call++) {
    int waiting = 0;
    float total = 0;
    if (now_seconds() - t0 > 60) FAIL("no process joined");
    if (rank == 0) CHECK_COMM(gocollCommJoiners(small, &waiting), small);
    CHECK_COMM(checked(small, call, (float)waiting, &total), small);
    if (total > 0) {
      CHECK_COMM(gocollCommGrow(small, (int)total, &grown), small);
      break;
    }
  }
  CHECK_COMM(gocollCommCount(grown, &n), grown);
  printf("GROWN size=%d\n", n);
  if (n != 4) FAIL("grew to %d ranks", n);
  last_steps(grown);
  CHECK(gocollCommDestroy(grown));
  CHECK(gocollCommDestroy(small));
  CHECK(gocollCommDestroy(comm));
  return 0;
}

static int run_scale(void) {
  gocollComm_t comm = NULL, small = NULL;
  gocollResult_t rc = gocollSuccess;
  const char* expect = getenv("GOCOLL_TEST_EXPECT");
  int victim = atoi(getenv("GOCOLL_TEST_VICTIM")), size = 0, n = 0, rank = 0, failed[8], nfailed = 0, want;
  long call;
  double t0;
  CHECK(gocollCommInitFromEnv(&comm));
  CHECK_COMM(gocollCommUserRank(comm, &g_rank), comm);
  CHECK_COMM(gocollCommCount(comm, &size), comm);
  want = expect && *expect ? atoi(expect) : size - 1;
  printf("READY\n");
  fflush(stdout);
  for (call = 0; rc == gocollSuccess; call++) {
    if (call == 5 && g_rank == victim) kill(getpid(), SIGKILL);
    rc = checked(comm, call, 0, NULL);
  }
  printf("FAILED code=%d err=%s\n", (int)rc, gocollGetLastError(comm));
  fflush(stdout);
  if (rc != gocollRemoteError && rc != gocollTimeout) FAIL("allreduce failed with %d", (int)rc);
  t0 = now_seconds();
  rc = gocollCommShrink(comm, NULL, 0, &small, NULL, GOCOLL_SHRINK_ABORT);
  if (rc != gocollSuccess) {
    printf("OUT code=%d err=%s\n", (int)rc, gocollGetLastError(comm));
    fflush(stdout);
    CHECK(gocollCommDestroy(comm));
    return 0;
  }
  CHECK_COMM(gocollCommCount(small, &n), small);
  CHECK_COMM(gocollCommUserRank(small, &rank), small);
  CHECK_COMM(gocollCommGetFailed(comm, failed, 8, &nfailed), comm);
  printf("SHRUNK size=%d rank=%d ms=%.1f failed=%d:%d\n", n, rank, (now_seconds() - t0) * 1e3, nfailed,
         nfailed > 0 ? failed[0] : -1);
  fflush(stdout);
  if (n != want) FAIL("shrunk to rank %d of %d, want %d ranks", rank, n, want);
  if (victim >= 0 && want == size - 1) {
    if (rank != g_rank - (g_rank > victim)) FAIL("shrunk to rank %d of %d", rank, n);
    if (nfailed != 1 || failed[0] != victim) FAIL("gocollCommGetFailed: %d ranks, first %d", nfailed, failed[0]);
  }
  for (call = 0; call < 5; call++) CHECK_COMM(checked(small, call, 0, NULL), small);
  printf("SUMS OK\n");
  fflush(stdout);
  /* A training job goes on for a while: a rank that resumes from a stop
   * meanwhile must find the others still answering. */
  if (getenv("GOCOLL_TEST_LINGER_MS")) sleep_ms(atoi(getenv("GOCOLL_TEST_LINGER_MS")));
  CHECK(gocollCommDestroy(small));
  CHECK(gocollCommDestroy(comm));
  return 0;
}

static int run_join(void) {
  const char* joinfile = getenv("GOCOLL_TEST_JOINFILE");
  char info[512] = {0};
  gocollComm_t c = NULL;
  int n = 0;
  FILE* f = NULL;
  double t0 = now_seconds();
  while (!(f = fopen(joinfile, "r"))) {
    if (now_seconds() - t0 > 60) FAIL("no join file");
    sleep_ms(10);
  }
  if (!fgets(info, sizeof info, f)) FAIL("empty join file");
  fclose(f);
  CHECK(gocollCommJoin(&c, info, NULL, NULL));
  CHECK_COMM(gocollCommUserRank(c, &g_rank), c);
  CHECK_COMM(gocollCommCount(c, &n), c);
  printf("JOINED rank=%d size=%d\n", g_rank, n);
  last_steps(c);
  CHECK(gocollCommDestroy(c));
  return 0;
}

enum { VDEV = 8, VN = 1000, VSTEPS = 40 };

static double vgrad(int dev, long step, int i) { return (double)((dev * 131 + step * 17 + i * 7) % 97) / (1.0 + dev) - 0.3; }

static int run_vrecover(void) {
  gocollComm_t comm = NULL, small = NULL;
  gocollVComm_t vc = NULL;
  const char* v = getenv("GOCOLL_TEST_VICTIM");
  int victim = v ? atoi(v) : -1, devs[VDEV], n = 0, k, i;
  static double w[VN], g[VDEV][VN];
  uint64_t step = 0, agreed = 0;
  unsigned long long sum = 1469598103934665603ULL;
  gocollResult_t rc;
  CHECK(gocollCommInitFromEnv(&comm));
  CHECK_COMM(gocollCommUserRank(comm, &g_rank), comm);
  CHECK_COMM(gocollVCommCreate(&vc, comm, "ring", VDEV, NULL), comm);
  CHECK_COMM(gocollVCommRegisterShared(vc, "w", w, sizeof w), comm);
  while (step < VSTEPS) {
    void* bufs[VDEV];
    CHECK_COMM(gocollVCommLocal(vc, devs, VDEV, &n), comm);
    for (k = 0; k < n; k++) {
      for (i = 0; i < VN; i++) g[k][i] = vgrad(devs[k], (long)step, i) + 0.01 * w[i];
      bufs[k] = g[k];
    }
    rc = gocollVAllReduce((const void**)bufs, bufs, VN, gocollFloat64, gocollAvg, vc);
    if (rc != gocollSuccess) {
      gocollComm_t cur = small ? small : comm, next = NULL;
      printf("FAILED step=%llu code=%d\n", (unsigned long long)step, (int)rc);
      if (rc != gocollRemoteError && rc != gocollTimeout && rc != gocollRevoked) FAIL("vallreduce failed with %d", (int)rc);
      CHECK_COMM(gocollCommShrink(cur, NULL, 0, &next, NULL, GOCOLL_SHRINK_ABORT), cur);
      if ((rc = gocollVCommRecover(vc, next, step, 4, NULL, NULL)) != gocollInvalidUsage)
        FAIL("recover onto 3 ranks with minRanks 4: %d, want gocollInvalidUsage", (int)rc);
      /* Ranks that pass different minRanks are refused on every rank. */
      if ((rc = gocollVCommRecover(vc, next, step, g_rank == 0 ? 3 : 2, NULL, NULL)) != gocollInvalidArgument)
        FAIL("recover with minRanks differing between ranks: %d, want gocollInvalidArgument", (int)rc);
      CHECK_COMM(gocollVCommRecover(vc, next, step, 2, NULL, &agreed), next);
      CHECK_COMM(gocollCommCount(next, &n), next);
      printf("RECOVERED size=%d step=%llu\n", n, (unsigned long long)agreed);
      if (small) CHECK(gocollCommDestroy(small));
      small = next;
      step = agreed;
      continue;
    }
    for (i = 0; i < VN; i++) w[i] -= 0.1 * g[0][i];
    step++;
    if (step == 10) {
      printf("READY\n");
      fflush(stdout);
      if (g_rank == victim)
        for (;;) sleep_ms(1000); /* the test kills it */
    }
  }
  for (i = 0; i < (int)sizeof w; i++) sum = (sum ^ ((unsigned char*)w)[i]) * 1099511628211ULL;
  printf("W %016llx\n", sum);
  CHECK_COMM(gocollVCommDestroy(vc), comm);
  if (small) CHECK(gocollCommDestroy(small));
  gocollCommDestroy(comm); /* revoked after a recovery: its result says nothing new */
  return 0;
}

static int run_noquorum(void) {
  gocollComm_t comm = NULL, small = NULL;
  gocollResult_t rc;
  CHECK(gocollCommInitFromEnv(&comm));
  CHECK_COMM(gocollCommUserRank(comm, &g_rank), comm);
  rc = until_failure(comm, g_rank == 1 || g_rank == 2);
  if (rc != gocollRemoteError && rc != gocollTimeout) FAIL("allreduce failed with %d", (int)rc);
  rc = gocollCommShrink(comm, NULL, 0, &small, NULL, GOCOLL_SHRINK_ABORT);
  printf("SHRINK code=%d err=%s\n", (int)rc, gocollGetLastError(comm));
  if (rc != gocollNoQuorum) FAIL("shrink with 2 of 4 ranks under majority: %d, want gocollNoQuorum", (int)rc);
  if (small != NULL) FAIL("a failed shrink wrote *newcomm");
  printf("NOQUORUM %s\n", gocollGetErrorString(rc));
  gocollCommDestroy(comm);
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1 && strcmp(argv[1], "shrink") == 0) return run_shrink();
  if (argc > 1 && strcmp(argv[1], "join") == 0) return run_join();
  if (argc > 1 && strcmp(argv[1], "scale") == 0) return run_scale();
  if (argc > 1 && strcmp(argv[1], "vrecover") == 0) return run_vrecover();
  if (argc > 1 && strcmp(argv[1], "noquorum") == 0) return run_noquorum();
  fprintf(stderr, "usage: elastic shrink|join|vrecover|noquorum\n");
  return 2;
}
