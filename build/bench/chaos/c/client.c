/* The C workload of build/chaos: a job that keeps allreducing through
 * whatever the harness does to it, and says which view it is in.
 *
 *   client          a member (GOCOLL_RANK, GOCOLL_SIZE, GOCOLL_ROOT_ADDR,
 *                   GOCOLL_SECRET): CHAOS_CALLS checked allreduces (every
 *                   element compared with the sum the communicator's size
 *                   implies), CHAOS_SLEEP_MS apart. A failed call
 *                   (gocollRemoteError, gocollTimeout, gocollRevoked) is
 *                   followed by gocollCommShrink(comm, NULL, 0, &small, NULL,
 *                   GOCOLL_SHRINK_ABORT), again if a rank dies meanwhile (up
 *                   to 8 rounds); the members agree on the call to redo (the
 *                   lowest any of them is at). Each call carries rank 0's
 *                   gocollCommJoiners count; when it is not 0 every member
 *                   calls gocollCommGrow.
 *   client join     a replacement (CHAOS_REPLACES: the pid it replaces):
 *                   waits for a join file that no longer lists that pid,
 *                   gocollCommJoin (secret from GOCOLL_SECRET), then goes on
 *                   as a member.
 *
 * After every change of communicator each member prints
 *   VIEW gen=<g> size=<n> rank=<r> pids=<pid of rank 0>,<pid of rank 1>,...
 * (the pids all-gathered over the new communicator), and new rank 0
 * rewrites CHAOS_JOINFILE (join info, then "pids ..."). At the end:
 *   DONE gen=<g> size=<n> rank=<r> pids=...
 * and rank 0 prints "CALL <c>" every 10 calls (the harness's clock).
 * Exit codes: 0 done; 2 a call failed unexpectedly (common.h's CHECK);
 * 3 a wrong sum; 4 excluded (gocollExcluded: the others went on without
 * this process); 5 the recovery gave up; 6 the join gave up. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <gocoll.h>

enum { N = 1024, MAXRANKS = 256, ROUNDS = 8 };

static int g_rank = -1;
static float buf[N + 1];

#define DIE(code, ...)                                     \
  do {                                                     \
    fprintf(stderr, "chaos client rank %d: ", g_rank);     \
    fprintf(stderr, __VA_ARGS__);                          \
    fprintf(stderr, "\n");                                 \
    exit(code);                                            \
  } while (0)

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static long env_long(const char* name, long def) {
  const char* v = getenv(name);
  return v && *v ? atol(v) : def;
}

static int failure(gocollResult_t rc) {
  return rc == gocollRemoteError || rc == gocollTimeout || rc == gocollRevoked;
}

/* One allreduce of call `call` on c, every element checked; extra rides in
 * the last element (summed) and comes back in *total. */
static gocollResult_t checked(gocollComm_t c, long call, float extra, float* total) {
  int n = 0, rank = 0, i;
  gocollResult_t rc;
  if ((rc = gocollCommCount(c, &n)) != gocollSuccess) return rc;
  if ((rc = gocollCommUserRank(c, &rank)) != gocollSuccess) return rc;
  for (i = 0; i < N; i++) buf[i] = (float)((rank + 1) * ((call + i) % 7 + 1));
  buf[N] = extra;
  if ((rc = gocollAllReduce(buf, buf, N + 1, gocollFloat32, gocollSum, c)) != gocollSuccess) return rc;
  for (i = 0; i < N; i++) {
    float want = (float)(n * (n + 1) / 2 * ((call + i) % 7 + 1));
    if (buf[i] != want) DIE(3, "call %ld on %d ranks: element %d is %g, want %g", call, n, i, buf[i], want);
  }
  *total = buf[N];
  return gocollSuccess;
}

/* The job's state: its communicator now, the one it started on, the call
 * it is at and how many views it has been in. */
struct job {
  gocollComm_t comm, orig;
  long call, calls;
  int gen;
  const char* joinfile;
};

/* view all-gathers the members' pids over j->comm, prints the VIEW line
 * and, on rank 0, rewrites the join file. */
static gocollResult_t view(struct job* j, const char* what) {
  static int64_t pids[MAXRANKS];
  int64_t me = (int64_t)getpid();
  int n = 0, rank = 0, r;
  gocollResult_t rc;
  char line[MAXRANKS * 12 + 64];
  size_t off = 0;
  if ((rc = gocollCommCount(j->comm, &n)) != gocollSuccess) return rc;
  if ((rc = gocollCommUserRank(j->comm, &rank)) != gocollSuccess) return rc;
  if (n > MAXRANKS) DIE(2, "%d ranks: at most %d", n, MAXRANKS);
  if ((rc = gocollAllGather(&me, pids, 1, gocollInt64, j->comm)) != gocollSuccess) return rc;
  g_rank = rank;
  for (r = 0; r < n && off < sizeof line - 24; r++)
    off += (size_t)snprintf(line + off, sizeof line - off, "%s%lld", r ? "," : "", (long long)pids[r]);
  printf("%s gen=%d size=%d rank=%d pids=%s\n", what, j->gen, n, rank, line);
  fflush(stdout);
  if (rank == 0 && j->joinfile && *j->joinfile && strcmp(what, "VIEW") == 0) {
    char info[1024], tmp[4096];
    FILE* f;
    if ((rc = gocollCommJoinInfo(j->comm, info, sizeof info, NULL)) != gocollSuccess) return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp", j->joinfile);
    if (!(f = fopen(tmp, "w")) || fprintf(f, "%s\npids %s\n", info, line) < 0 || fclose(f) != 0 ||
        rename(tmp, j->joinfile) != 0)
      DIE(2, "writing %s", j->joinfile);
  }
  return gocollSuccess;
}

/* agree makes every member of j->comm go on from the same call: the
 * lowest (after a shrink: a call some completed and others did not is
 * redone) or the highest (after a grow: the joiners know none). */
static gocollResult_t agree(struct job* j, gocollRedOp_t op) {
  int64_t c = j->call;
  gocollResult_t rc = gocollAllReduce(&c, &c, 1, gocollInt64, op, j->comm);
  if (rc == gocollSuccess) j->call = (long)c;
  return rc;
}

static void replace(struct job* j, gocollComm_t next) {
  if (j->comm != j->orig) gocollCommDestroy(j->comm); /* failed on purpose: its result says nothing new */
  j->comm = next;
  j->gen++;
}

/* recover shrinks after a failed call until the survivors agree on a
 * communicator and the call to go on from. */
static void recover(struct job* j, gocollResult_t cause) {
  int round;
  for (round = 0; round < ROUNDS; round++) {
    gocollComm_t small = NULL;
    gocollResult_t rc = gocollCommShrink(j->comm, NULL, 0, &small, NULL, GOCOLL_SHRINK_ABORT);
    if (rc == gocollExcluded) {
      printf("EXCLUDED gen=%d\n", j->gen);
      fflush(stdout);
      DIE(4, "excluded: %s", gocollGetLastError(j->comm));
    }
    if (rc != gocollSuccess) DIE(5, "shrink after %d: %d (%s)", (int)cause, (int)rc, gocollGetLastError(j->comm));
    replace(j, small);
    if ((rc = agree(j, gocollMin)) == gocollSuccess && (rc = view(j, "VIEW")) == gocollSuccess) return;
    if (!failure(rc)) DIE(2, "after the shrink: %d (%s)", (int)rc, gocollGetLastError(j->comm));
    cause = rc; /* another rank died meanwhile: shrink again */
  }
  DIE(5, "%d shrink rounds failed", ROUNDS);
}

static void grow(struct job* j, int joiners) {
  gocollComm_t grown = NULL;
  gocollResult_t rc = gocollCommGrow(j->comm, joiners, &grown);
  if (rc != gocollSuccess) {
    printf("GROW FAILED joiners=%d code=%d err=%s\n", joiners, (int)rc, gocollGetLastError(j->comm));
    fflush(stdout);
    if (!failure(rc) && rc != gocollInvalidUsage) DIE(2, "grow: %d (%s)", (int)rc, gocollGetLastError(j->comm));
    recover(j, rc); /* a member or the joiner died: shrink the communicator we had */
    return;
  }
  replace(j, grown);
  if ((rc = agree(j, gocollMax)) != gocollSuccess || (rc = view(j, "VIEW")) != gocollSuccess) {
    if (!failure(rc)) DIE(2, "after the grow: %d (%s)", (int)rc, gocollGetLastError(j->comm));
    recover(j, rc);
  }
}

static void run(struct job* j, long sleepms) {
  while (j->call < j->calls) {
    int waiting = 0, rank = 0;
    float total = 0;
    gocollResult_t rc;
    if (gocollCommUserRank(j->comm, &rank) == gocollSuccess && rank == 0) gocollCommJoiners(j->comm, &waiting);
    rc = checked(j->comm, j->call, (float)waiting, &total);
    if (rc != gocollSuccess) {
      if (!failure(rc)) DIE(2, "call %ld: %d (%s)", j->call, (int)rc, gocollGetLastError(j->comm));
      printf("FAILED call=%ld code=%d err=%s\n", j->call, (int)rc, gocollGetLastError(j->comm));
      fflush(stdout);
      recover(j, rc);
      continue;
    }
    j->call++;
    if (rank == 0 && j->call % 10 == 0) printf("CALL %ld\n", j->call);
    if (total > 0) grow(j, (int)total);
    if (sleepms > 0) sleep_ms(sleepms);
  }
  j->gen++;
  if (view(j, "DONE") != gocollSuccess) DIE(2, "the last view: %s", gocollGetLastError(j->comm));
}

/* join_info reads the join file once it no longer lists the pid this
 * process replaces (the job has recovered from its death). */
static int join_info(const char* path, long replaces, char* info, size_t len) {
  char pids[MAXRANKS * 12 + 16] = {0};
  char *p, *tok, *save = NULL;
  FILE* f = fopen(path, "r");
  int ok;
  if (!f) return 0;
  ok = fgets(info, (int)len, f) != NULL && fgets(pids, sizeof pids, f) != NULL;
  fclose(f);
  if (!ok || strncmp(pids, "pids ", 5) != 0) return 0;
  info[strcspn(info, "\n")] = 0;
  pids[strcspn(pids, "\n")] = 0;
  for (p = pids + 5; (tok = strtok_r(p, ",", &save)) != NULL; p = NULL)
    if (atol(tok) == replaces) return 0;
  return 1;
}

static gocollComm_t join(const char* path) {
  long replaces = env_long("CHAOS_REPLACES", -1);
  double t0 = now_seconds(), limit = (double)env_long("CHAOS_JOIN_SECONDS", 60);
  char info[1024];
  while (now_seconds() - t0 < limit) {
    gocollComm_t c = NULL;
    gocollResult_t rc;
    if (!join_info(path, replaces, info, sizeof info)) {
      sleep_ms(20);
      continue;
    }
    if ((rc = gocollCommJoin(&c, info, NULL, NULL)) == gocollSuccess) return c;
    fprintf(stderr, "chaos client: join: %d (%s); trying again\n", (int)rc, gocollGetLastError(NULL));
    sleep_ms(100);
  }
  DIE(6, "not admitted within %.0f s", limit);
}

int main(int argc, char** argv) {
  struct job j = {0};
  long sleepms = env_long("CHAOS_SLEEP_MS", 10);
  gocollResult_t rc;
  setvbuf(stdout, NULL, _IOLBF, 0);
  j.calls = env_long("CHAOS_CALLS", 400);
  j.joinfile = getenv("CHAOS_JOINFILE");
  if (argc > 1 && strcmp(argv[1], "join") == 0) {
    j.comm = j.orig = join(j.joinfile);
    if ((rc = agree(&j, gocollMax)) != gocollSuccess || (rc = view(&j, "VIEW")) != gocollSuccess) {
      if (!failure(rc)) DIE(2, "after joining: %d (%s)", (int)rc, gocollGetLastError(j.comm));
      recover(&j, rc);
    }
  } else if (argc > 1) {
    fprintf(stderr, "usage: client [join]\n");
    return 2;
  } else {
    if ((rc = gocollCommInitFromEnv(&j.comm)) != gocollSuccess) DIE(2, "init: %d (%s)", (int)rc, gocollGetLastError(NULL));
    j.orig = j.comm;
    if ((rc = view(&j, "VIEW")) != gocollSuccess) DIE(2, "the first view: %d (%s)", (int)rc, gocollGetLastError(j.comm));
  }
  run(&j, sleepms);
  if (j.comm != j.orig) gocollCommDestroy(j.comm);
  gocollCommDestroy(j.orig); /* revoked after a recovery: its result says nothing new */
  return 0;
}
