/* Feeds gocoll.h bad input and checks that every call returns the
 * documented code with a non-empty last-error text, and never crashes:
 * NULL pointers, never-created/destroyed/aborted handles, unknown datatypes
 * and ops, roots and peers out of range, overlapping buffers, sizes that do
 * not fit, freed requests, and per-thread error texts. One process, one
 * rank. Prints "OK badinput" on success. */
#include <pthread.h>
#include <stdint.h>

#include "common.h"

static int checks;

#define EXPECT(call, want, comm) expect_rc(#call, __LINE__, (call), (want), (comm))

static void expect_rc(const char* what, int line, gocollResult_t got, gocollResult_t want, gocollComm_t comm) {
  checks++;
  if (got != want) {
    fprintf(stderr, "line %d: %s -> %d (%s), want %d (%s); last error: %s\n", line, what, (int)got,
            gocollGetErrorString(got), (int)want, gocollGetErrorString(want), gocollGetLastError(comm));
    exit(3);
  }
  if (want != gocollSuccess) {
    const char* e = gocollGetLastError(comm);
    const char* t = gocollGetLastError(NULL);
    if (e == NULL || e[0] == '\0' || t == NULL || t[0] == '\0') {
      fprintf(stderr, "line %d: %s: empty last-error text\n", line, what);
      exit(3);
    }
    printf("  %-70.70s -> %d: %s\n", what, (int)got, e);
  }
}

static void expect_text(const char* text, const char* needle) {
  if (strstr(text, needle) == NULL) FAIL("last error lacks \"%s\": %s", needle, text);
}

static gocollComm_t one_rank_comm(void) {
  gocollUniqueId id;
  gocollComm_t c = NULL;
  CHECK(gocollGetUniqueId(&id));
  CHECK(gocollCommInitRank(&c, 1, id, 0));
  return c;
}

static gocollComm_t g_comm;

static void* thread_errors(void* arg) {
  int k = (int)(intptr_t)arg, i;
  char want[64];
  float buf[4] = {0};
  snprintf(want, sizeof want, "unknown datatype %d", 100 + k);
  for (i = 0; i < 200; i++) {
    if (gocollAllReduce(buf, buf, 4, (gocollDataType_t)(100 + k), gocollSum, g_comm) != gocollInvalidArgument)
      FAIL("thread %d: wrong code", k);
    if (strstr(gocollGetLastError(NULL), want) == NULL)
      FAIL("thread %d sees another thread's error: %s", k, gocollGetLastError(NULL));
  }
  return NULL;
}

int main(void) {
  gocollComm_t comm, dead, aborted, none = NULL;
  gocollComm_t bogus = (gocollComm_t)(uintptr_t)0x12345;
  gocollComm_t bogus2 = (gocollComm_t)(uintptr_t)0xdeadbeef;
  gocollRequest_t req = NULL, bogusreq = (gocollRequest_t)(uintptr_t)0x7777;
  gocollUniqueId zero;
  float buf[16] = {0}, out[16];
  size_t counts[1] = {4}, displs[1] = {0}, huge[1] = {SIZE_MAX / 2};
  int n = 0, done = 0, i;
  void* mem = NULL;
  gocollResult_t async;
  pthread_t th[4];

  setvbuf(stdout, NULL, _IOLBF, 0);
  g_rank = 0;
  memset(&zero, 0, sizeof zero);

  /* Library-level calls. */
  EXPECT(gocollGetVersion(NULL), gocollInvalidArgument, NULL);
  EXPECT(gocollGetUniqueId(NULL), gocollInvalidArgument, NULL);
  for (i = 0; i < gocollNumResults; i++) {
    const char* s = gocollGetErrorString((gocollResult_t)i);
    if (!s || !*s || strcmp(s, "unknown result code") == 0) FAIL("no error string for %d", i);
  }
  if (strcmp(gocollGetErrorString((gocollResult_t)99), "unknown result code") != 0) FAIL("error string for 99");

  /* Communicator creation. */
  EXPECT(gocollCommInitRank(NULL, 1, zero, 0), gocollInvalidArgument, NULL);
  EXPECT(gocollCommInitRank(&none, 0, zero, 0), gocollInvalidArgument, NULL);
  EXPECT(gocollCommInitRank(&none, 2, zero, 2), gocollInvalidArgument, NULL);
  EXPECT(gocollCommInitRank(&none, 2, zero, -1), gocollInvalidArgument, NULL);
  EXPECT(gocollCommInitRank(&none, 1, zero, 0), gocollInvalidArgument, NULL); /* not a unique id */
  if (none != NULL) FAIL("failed init wrote *comm");
  EXPECT(gocollCommInitFromEnv(NULL), gocollInvalidArgument, NULL);
  comm = one_rank_comm();
  g_comm = comm;

  /* Communicator queries. */
  EXPECT(gocollCommCount(NULL, &n), gocollInvalidArgument, NULL);
  EXPECT(gocollCommCount(bogus, &n), gocollInvalidArgument, bogus);
  EXPECT(gocollCommCount(comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollCommUserRank(bogus2, &n), gocollInvalidArgument, bogus2);
  EXPECT(gocollCommUserRank(comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollCommGetAsyncError(comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollCommGetAsyncError((gocollComm_t)bogusreq, &async), gocollInvalidArgument, NULL);
  {
    char small[8];
    size_t need = 0;
    EXPECT(gocollCommGetTopology(bogus, NULL, 0, &need), gocollInvalidArgument, bogus);
    EXPECT(gocollCommGetTopology(comm, NULL, 0, NULL), gocollInvalidArgument, comm);
    EXPECT(gocollCommGetTopology(comm, NULL, 8, &need), gocollInvalidArgument, comm);
    EXPECT(gocollCommGetTopology(comm, small, sizeof small, &need), gocollInvalidArgument, comm);
    if (need <= sizeof small) FAIL("topology needs %zu bytes after a too-small buffer", need);
  }

  /* Null buffers, bad handles, types, ops. */
  EXPECT(gocollAllReduce(NULL, out, 4, gocollFloat32, gocollSum, comm), gocollInvalidArgument, comm);
  expect_text(gocollGetLastError(comm), "sendbuff is NULL");
  EXPECT(gocollAllReduce(buf, NULL, 4, gocollFloat32, gocollSum, comm), gocollInvalidArgument, comm);
  expect_text(gocollGetLastError(comm), "recvbuff is NULL");
  EXPECT(gocollAllReduce(NULL, NULL, 0, gocollFloat32, gocollSum, comm), gocollSuccess, comm);
  EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, gocollSum, NULL), gocollInvalidArgument, NULL);
  EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, gocollSum, bogus), gocollInvalidArgument, bogus);
  expect_text(gocollGetLastError(NULL), "not a communicator");
  EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, gocollSum, bogus2), gocollInvalidArgument, bogus2);
  EXPECT(gocollAllReduce(buf, out, 4, (gocollDataType_t)10, gocollSum, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllReduce(buf, out, 4, (gocollDataType_t)-1, gocollSum, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, (gocollRedOp_t)5, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, (gocollRedOp_t)-3, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllReduce(buf, out, SIZE_MAX, gocollFloat32, gocollSum, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllReduce(buf, out, SIZE_MAX / 4 + 1, gocollFloat32, gocollSum, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllGather(buf, out, SIZE_MAX / 2, gocollInt8, comm), gocollInvalidArgument, comm);

  /* Overlapping buffers that are not in place. */
  EXPECT(gocollAllReduce(buf, buf + 1, 4, gocollFloat32, gocollSum, comm), gocollInvalidArgument, comm);
  expect_text(gocollGetLastError(comm), "overlap");
  EXPECT(gocollAllGather(buf + 1, buf, 4, gocollFloat32, comm), gocollInvalidArgument, comm);
  EXPECT(gocollReduceScatter(buf, buf + 2, 4, gocollFloat32, gocollSum, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllToAll(buf + 3, buf, 4, gocollFloat32, comm), gocollInvalidArgument, comm);
  EXPECT(gocollBroadcast(buf, buf + 1, 4, gocollFloat32, 0, comm), gocollInvalidArgument, comm);
  EXPECT(gocollReduce(buf, buf + 1, 4, gocollFloat32, gocollSum, 0, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllToAllv(buf, counts, displs, buf + 2, counts, displs, gocollFloat32, comm), gocollInvalidArgument, comm);
  /* ...while the in-place forms are fine. */
  EXPECT(gocollAllReduce(buf, buf, 4, gocollFloat32, gocollSum, comm), gocollSuccess, comm);
  EXPECT(gocollAllGather(buf, buf, 4, gocollFloat32, comm), gocollSuccess, comm);
  EXPECT(gocollReduceScatter(buf, buf, 4, gocollFloat32, gocollSum, comm), gocollSuccess, comm);

  /* Roots and peers. */
  EXPECT(gocollReduce(buf, out, 4, gocollFloat32, gocollSum, -1, comm), gocollInvalidArgument, comm);
  EXPECT(gocollReduce(buf, out, 4, gocollFloat32, gocollSum, 1, comm), gocollInvalidArgument, comm);
  EXPECT(gocollBroadcast(buf, out, 4, gocollFloat32, 5, comm), gocollInvalidArgument, comm);
  EXPECT(gocollBroadcast(buf, out, 4, gocollFloat32, -2, comm), gocollInvalidArgument, comm);
  EXPECT(gocollSend(buf, 4, gocollFloat32, 1, comm), gocollInvalidArgument, comm);
  EXPECT(gocollSend(buf, 4, gocollFloat32, -1, comm), gocollInvalidArgument, comm);
  EXPECT(gocollRecv(out, 4, gocollFloat32, 7, comm), gocollInvalidArgument, comm);
  EXPECT(gocollSend(buf, 4, gocollFloat32, 0, comm), gocollInvalidUsage, comm); /* to self */
  EXPECT(gocollRecv(out, 4, gocollFloat32, 0, comm), gocollInvalidUsage, comm);
  EXPECT(gocollSend(NULL, 4, gocollFloat32, 1, comm), gocollInvalidArgument, comm);
  EXPECT(gocollSendTag(buf, 4, gocollFloat32, 0, -1, comm), gocollInvalidArgument, comm);
  EXPECT(gocollRecvTag(out, 4, gocollFloat32, 0, -2, comm), gocollInvalidArgument, comm);
  EXPECT(gocollRecvAny(out, 4, gocollFloat32, -2, NULL, comm), gocollInvalidArgument, comm);
  EXPECT(gocollRecvAny(out, 4, (gocollDataType_t)99, 0, NULL, comm), gocollInvalidArgument, comm);
  EXPECT(gocollSend(buf, 4, gocollFloat32, GOCOLL_ANY_SOURCE, comm), gocollInvalidArgument, comm);
  EXPECT(gocollRecvAny(out, 4, gocollFloat32, 0, NULL, comm), gocollInvalidUsage, comm); /* nobody else */

  /* All-to-allv arrays. */
  EXPECT(gocollAllToAllv(buf, NULL, displs, out, counts, displs, gocollFloat32, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllToAllv(buf, counts, displs, out, counts, NULL, gocollFloat32, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllToAllv(buf, huge, displs, out, counts, displs, gocollFloat32, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllToAllv(NULL, counts, displs, out, counts, displs, gocollFloat32, comm), gocollInvalidArgument, comm);
  EXPECT(gocollAllToAllv(buf, counts, displs, out, counts, displs, gocollFloat32, comm), gocollSuccess, comm);

  /* All-to-allw arrays and block types (displacements in bytes). */
  {
    size_t wd[1] = {0};
    gocollBlockType_t every_other = {gocollFloat32, 3, 1, 2}; /* elements 0, 2, 4 */
    gocollBlockType_t three = {gocollFloat32, 1, 3, 0};
    gocollBlockType_t badtype = {(gocollDataType_t)77, 1, 1, 1};
    gocollBlockType_t overlapping = {gocollFloat32, 2, 2, 1};
    gocollBlockType_t huge_vec = {gocollFloat32, SIZE_MAX, 1, SIZE_MAX};
    buf[0] = 1; buf[2] = 2; buf[4] = 3;
    EXPECT(gocollAllToAllw(buf, NULL, &every_other, out, wd, &three, comm), gocollInvalidArgument, comm);
    expect_text(gocollGetLastError(comm), "NULL");
    EXPECT(gocollAllToAllw(buf, wd, &every_other, out, wd, NULL, comm), gocollInvalidArgument, comm);
    EXPECT(gocollAllToAllw(buf, wd, &badtype, out, wd, &three, comm), gocollInvalidArgument, comm);
    expect_text(gocollGetLastError(comm), "unknown datatype 77");
    EXPECT(gocollAllToAllw(buf, wd, &overlapping, out, wd, &overlapping, comm), gocollInvalidArgument, comm);
    expect_text(gocollGetLastError(comm), "overlap");
    EXPECT(gocollAllToAllw(buf, wd, &huge_vec, out, wd, &three, comm), gocollInvalidArgument, comm);
    EXPECT(gocollAllToAllw(NULL, wd, &every_other, out, wd, &three, comm), gocollInvalidArgument, comm);
    EXPECT(gocollAllToAllw(buf, wd, &every_other, out, wd, &three, comm), gocollSuccess, comm);
    if (out[0] != 1 || out[1] != 2 || out[2] != 3) FAIL("alltoallw to itself: %g %g %g", out[0], out[1], out[2]);
    EXPECT(gocollIAllToAllw(buf, wd, &every_other, out, wd, &three, comm, NULL), gocollInvalidArgument, comm);
    buf[0] = buf[2] = buf[4] = 0;
  }

  /* Non-blocking forms need a request pointer; nothing is started without. */
  EXPECT(gocollIAllReduce(buf, out, 4, gocollFloat32, gocollSum, comm, NULL), gocollInvalidArgument, comm);
  expect_text(gocollGetLastError(comm), "request is NULL");
  EXPECT(gocollIReduce(buf, out, 4, gocollFloat32, gocollSum, 0, comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollIBroadcast(buf, out, 4, gocollFloat32, 0, comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollIAllGather(buf, out, 4, gocollFloat32, comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollIReduceScatter(buf, out, 4, gocollFloat32, gocollSum, comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollIAllToAll(buf, out, 4, gocollFloat32, comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollIAllToAllv(buf, counts, displs, out, counts, displs, gocollFloat32, comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollISend(buf, 4, gocollFloat32, 0, comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollIRecv(out, 4, gocollFloat32, 0, comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollIBarrier(comm, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollIAllReduce(buf, out, 4, (gocollDataType_t)77, gocollSum, comm, &req), gocollInvalidArgument, comm);
  if (req != NULL) FAIL("failed I-call wrote *request");

  /* Requests. */
  EXPECT(gocollTest(NULL, &done), gocollInvalidArgument, NULL);
  EXPECT(gocollTest(bogusreq, &done), gocollInvalidArgument, NULL);
  EXPECT(gocollWait(NULL), gocollInvalidArgument, NULL);
  EXPECT(gocollWait(bogusreq), gocollInvalidArgument, NULL);
  EXPECT(gocollWait((gocollRequest_t)comm), gocollInvalidArgument, NULL); /* a comm is no request */
  EXPECT(gocollIBarrier(comm, &req), gocollSuccess, comm);
  EXPECT(gocollTest(req, NULL), gocollInvalidArgument, NULL);
  EXPECT(gocollWait(req), gocollSuccess, comm);
  EXPECT(gocollWait(req), gocollInvalidUsage, NULL);
  expect_text(gocollGetLastError(NULL), "freed");
  EXPECT(gocollTest(req, &done), gocollInvalidUsage, NULL);
  EXPECT(gocollIAllReduce(buf, out, 4, gocollFloat32, gocollSum, comm, &req), gocollSuccess, comm);
  done = 0;
  while (!done) EXPECT(gocollTest(req, &done), gocollSuccess, comm);
  EXPECT(gocollTest(req, &done), gocollInvalidUsage, NULL);
  if (done != 0) FAIL("gocollTest on a freed request left *done = %d", done);

  /* Memory. */
  EXPECT(gocollMemAlloc(NULL, 64, comm), gocollInvalidArgument, comm);
  EXPECT(gocollMemAlloc(&mem, 0, comm), gocollInvalidArgument, comm);
  EXPECT(gocollMemAlloc(&mem, 64, bogus), gocollInvalidArgument, NULL);
  EXPECT(gocollMemAlloc(&mem, (size_t)-1, comm), gocollInvalidArgument, comm);
  EXPECT(gocollMemFree(NULL, comm), gocollInvalidArgument, comm);
  EXPECT(gocollMemFree(buf, comm), gocollInvalidArgument, comm);
  EXPECT(gocollMemAlloc(&mem, 64, comm), gocollSuccess, comm);
  EXPECT(gocollMemFree(mem, comm), gocollSuccess, comm);
  EXPECT(gocollMemFree(mem, comm), gocollInvalidArgument, comm);

  /* Split. */
  EXPECT(gocollCommSplit(comm, -5, 0, &none), gocollInvalidArgument, comm);
  EXPECT(gocollCommSplit(comm, 0, 0, NULL), gocollInvalidArgument, comm);
  EXPECT(gocollCommSplit(bogus, 0, 0, &none), gocollInvalidArgument, NULL);

  /* Per-thread error texts do not mix. */
  for (i = 0; i < 4; i++) pthread_create(&th[i], NULL, thread_errors, (void*)(intptr_t)i);
  for (i = 0; i < 4; i++) pthread_join(th[i], NULL);

  /* Argument errors leave the communicator usable. */
  EXPECT(gocollCommGetAsyncError(comm, &async), gocollSuccess, comm);
  if (async != gocollSuccess) FAIL("async error %d after argument errors", (int)async);
  EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, gocollSum, comm), gocollSuccess, comm);
  /* The comm's text is still the last failure on it. */
  expect_text(gocollGetLastError(comm), "unknown datatype");

  /* A request outlives its destroyed communicator. */
  EXPECT(gocollIAllReduce(buf, out, 4, gocollFloat32, gocollSum, comm, &req), gocollSuccess, comm);
  EXPECT(gocollMemAlloc(&mem, 4096, comm), gocollSuccess, comm);
  dead = comm;
  EXPECT(gocollCommDestroy(comm), gocollSuccess, NULL);
  EXPECT(gocollWait(req), gocollSuccess, NULL);
  EXPECT(gocollMemFree(mem, NULL), gocollSuccess, NULL); /* after destroy */

  /* Destroyed communicator. */
  EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, gocollSum, dead), gocollInvalidUsage, dead);
  expect_text(gocollGetLastError(dead), "destroyed");
  EXPECT(gocollIAllReduce(buf, out, 4, gocollFloat32, gocollSum, dead, &req), gocollInvalidUsage, dead);
  EXPECT(gocollBarrier(dead), gocollInvalidUsage, dead);
  EXPECT(gocollCommCount(dead, &n), gocollInvalidUsage, dead);
  EXPECT(gocollCommDestroy(dead), gocollInvalidUsage, dead);
  EXPECT(gocollCommAbort(dead), gocollInvalidUsage, dead);
  EXPECT(gocollCommSplit(dead, 0, 0, &none), gocollInvalidUsage, dead);

  /* Aborted communicator: the handle is gone, as after destroy. */
  aborted = one_rank_comm();
  EXPECT(gocollCommAbort(aborted), gocollSuccess, NULL);
  EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, gocollSum, aborted), gocollInvalidUsage, aborted);
  EXPECT(gocollCommDestroy(aborted), gocollInvalidUsage, aborted);
  EXPECT(gocollCommAbort(NULL), gocollInvalidArgument, NULL);
  EXPECT(gocollCommDestroy(NULL), gocollInvalidArgument, NULL);

  /* Revoke, shrink, failed ranks, grow: bad input; then a revoked
   * one-rank communicator shrinks to itself. */
  {
    gocollComm_t r = one_rank_comm(), s = NULL, g = NULL;
    int list[2] = {1, 0}, failed[4], nf = -1;
    char info[256];
    EXPECT(gocollCommRevoke(NULL, 0), gocollInvalidArgument, NULL);
    EXPECT(gocollCommRevoke(r, 7), gocollInvalidArgument, r);
    EXPECT(gocollCommShrink(r, NULL, 0, NULL, NULL, 0), gocollInvalidArgument, r);
    EXPECT(gocollCommShrink(r, list, 1, &s, NULL, 0), gocollInvalidArgument, r);
    expect_text(gocollGetLastError(r), "out of range");
    EXPECT(gocollCommShrink(r, list + 1, 1, &s, NULL, 0), gocollInvalidArgument, r);
    expect_text(gocollGetLastError(r), "excludes itself");
    EXPECT(gocollCommShrink(r, NULL, 2, &s, NULL, 0), gocollInvalidArgument, r);
    EXPECT(gocollCommShrink(r, list, -1, &s, NULL, 0), gocollInvalidArgument, r);
    EXPECT(gocollCommShrink(r, NULL, 0, &s, NULL, 5), gocollInvalidArgument, r);
    EXPECT(gocollCommShrink(r, list, 1, &s, NULL, GOCOLL_SHRINK_ABORT), gocollInvalidArgument, r);
    /* A refused list revoked nothing. */
    EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, gocollSum, r), gocollSuccess, r);
    if (s != NULL) FAIL("failed shrink wrote *newcomm");
    EXPECT(gocollCommGetFailed(r, NULL, 0, NULL), gocollInvalidArgument, r);
    EXPECT(gocollCommGetFailed(r, NULL, 3, &nf), gocollInvalidArgument, r);
    EXPECT(gocollCommGetFailed(r, failed, -1, &nf), gocollInvalidArgument, r);
    EXPECT(gocollCommGetFailed(r, NULL, 0, &nf), gocollSuccess, r);
    if (nf != 0) FAIL("%d failed ranks in a healthy communicator", nf);
    EXPECT(gocollCommGrow(r, 0, &g), gocollInvalidArgument, r);
    EXPECT(gocollCommGrow(r, 1, NULL), gocollInvalidArgument, r);
    EXPECT(gocollCommJoiners(r, NULL), gocollInvalidArgument, r);
    EXPECT(gocollCommJoiners(r, &nf), gocollSuccess, r);
    if (nf != 0) FAIL("%d processes waiting to join", nf);
    EXPECT(gocollCommJoinInfo(r, info, sizeof info, NULL), gocollSuccess, r);
    expect_text(info, "gocoll-join:");
    EXPECT(gocollCommJoin(NULL, info, NULL, NULL), gocollInvalidArgument, NULL);
    EXPECT(gocollCommJoin(&g, NULL, NULL, NULL), gocollInvalidArgument, NULL);
    EXPECT(gocollCommJoin(&g, "garbage", &zero, NULL), gocollInvalidArgument, NULL);
    if (g != NULL) FAIL("failed join wrote *comm");
    EXPECT(gocollCommRevoke(r, 0), gocollSuccess, r);
    EXPECT(gocollCommRevoke(r, 0), gocollSuccess, r);
    EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, gocollSum, r), gocollRevoked, r);
    expect_text(gocollGetLastError(r), "revoked");
    EXPECT(gocollCommShrink(r, NULL, 0, &s, NULL, GOCOLL_SHRINK_DEFAULT), gocollSuccess, r);
    EXPECT(gocollCommCount(s, &n), gocollSuccess, s);
    if (n != 1) FAIL("shrunk to %d ranks", n);
    EXPECT(gocollAllReduce(buf, out, 4, gocollFloat32, gocollSum, s), gocollSuccess, s);
    EXPECT(gocollCommDestroy(s), gocollSuccess, NULL);
    EXPECT(gocollCommDestroy(r), gocollSuccess, NULL);
  }

  /* Virtual devices recovered onto a shrunk communicator: bad input, then
   * a one-rank job recovers its two devices onto itself. */
  {
    gocollComm_t r = one_rank_comm(), s = NULL;
    gocollVComm_t vc = NULL, vj = NULL;
    double w[4] = {1, 2, 3, 4};
    float v0[4] = {1, 1, 1, 1}, v1[4] = {2, 2, 2, 2};
    void* vb[2] = {v0, v1};
    uint64_t agreed = 99;
    EXPECT(gocollVCommCreate(&vc, r, "ring", 2, NULL), gocollSuccess, r);
    EXPECT(gocollVCommRegisterShared(vc, NULL, w, sizeof w), gocollInvalidArgument, r);
    EXPECT(gocollVCommRegisterShared(vc, "w", w, sizeof w), gocollSuccess, r);
    EXPECT(gocollCommRevoke(r, 0), gocollSuccess, r);
    EXPECT(gocollCommShrink(r, NULL, 0, &s, NULL, GOCOLL_SHRINK_DEFAULT), gocollSuccess, r);
    EXPECT(gocollVCommRecover(vc, NULL, 0, 0, NULL, NULL), gocollInvalidArgument, r);
    EXPECT(gocollVCommRecover(vc, s, 0, -1, NULL, NULL), gocollInvalidArgument, r);
    EXPECT(gocollVCommRecover(vc, s, 0, 2, NULL, NULL), gocollInvalidUsage, r);
    expect_text(gocollGetLastError(r), "too few processes");
    {
      int bad[2] = {0, 1};
      EXPECT(gocollVCommRecover(vc, s, 0, 0, bad, NULL), gocollInvalidArgument, r);
    }
    EXPECT(gocollVCommRecover(vc, s, 3, 1, NULL, &agreed), gocollSuccess, s);
    if (agreed != 3) FAIL("agreed step %llu, want 3", (unsigned long long)agreed);
    EXPECT(gocollVAllReduce((const void**)vb, vb, 4, gocollFloat32, gocollSum, vc), gocollSuccess, s);
    if (v0[0] != 3 || v1[3] != 3) FAIL("virtual allreduce after recovery: %g %g", v0[0], v1[3]);
    EXPECT(gocollVCommJoin(NULL, s, "ring", 2, 0, NULL), gocollInvalidArgument, s);
    EXPECT(gocollVCommJoin(&vj, s, NULL, 2, 0, NULL), gocollInvalidArgument, s);
    EXPECT(gocollVCommJoin(&vj, s, "ring", 0, 0, NULL), gocollInvalidArgument, s);
    EXPECT(gocollVCommJoin(&vj, s, "ring", 2, -1, NULL), gocollInvalidArgument, s);
    if (vj != NULL) FAIL("failed join wrote *vcomm");
    EXPECT(gocollVCommDestroy(vc), gocollSuccess, NULL);
    EXPECT(gocollCommDestroy(s), gocollSuccess, NULL);
    EXPECT(gocollCommDestroy(r), gocollSuccess, NULL);
  }

  /* gocollGetLastError never returns NULL. */
  if (gocollGetLastError(bogus) == NULL || gocollGetLastError(NULL) == NULL) FAIL("NULL last error");

  printf("OK badinput (%d checks)\n", checks);
  return 0;
}
