/* Runs every collective of gocoll.h on every rank and checks the results.
 *
 *   collectives env              join through the launcher environment
 *                                (torchrun variables, mpirun, ...)
 *   collectives uid RANK NRANKS  rank 0 prints "UID <hex>" on stdout; the
 *                                others read that line on stdin
 *   collectives setenv RANK NRANKS PORT
 *                                sets torchrun's variables with setenv()
 *                                after the library was loaded, then joins
 *
 * Every collective runs in three completion modes: blocking, I-form +
 * gocollWait, I-form + gocollTest polling. Values are small integers (and
 * quarters for averages) so that every type, float16 and bfloat16 included,
 * holds every input and result exactly: results are compared bit for bit.
 * Prints "OK rank R of N" on success; any failure exits non-zero. */
#include <sched.h>

#include "common.h"

static gocollComm_t comm;
static int nranks;
static int mode; /* 0 blocking, 1 I-form + Wait, 2 I-form + Test */
static const char* mode_names[] = {"blocking", "wait", "test"};

static void complete(gocollRequest_t req) {
  int done = 0;
  if (mode == 1) {
    CHECK_COMM(gocollWait(req), comm);
    return;
  }
  while (!done) {
    CHECK_COMM(gocollTest(req, &done), comm);
    if (!done) sched_yield();
  }
}

/* RUN issues a blocking call, or its I-form (which must store its request in
 * rq_) and completes it, depending on mode. */
#define RUN(blocking, nonblocking)        \
  do {                                    \
    if (mode == 0) {                      \
      CHECK_COMM(blocking, comm);         \
    } else {                              \
      gocollRequest_t rq_ = NULL;         \
      CHECK_COMM(nonblocking, comm);      \
      if (rq_ == NULL) FAIL("no request"); \
      complete(rq_);                      \
    }                                     \
  } while (0)

static int is_signed(gocollDataType_t dt) {
  return dt != gocollUint8 && dt != gocollUint32 && dt != gocollUint64;
}
/* The types whose arithmetic ops this program checks numerically: all but
 * bool and the numbers that are no type (types.c covers bool and the
 * bitwise ops). */
static int is_number(gocollDataType_t dt) {
  return dtype_size(dt) != 0 && dt != gocollBool;
}
static int is_float(gocollDataType_t dt) {
  return dt == gocollFloat16 || dt == gocollFloat32 || dt == gocollFloat64 || dt == gocollBfloat16;
}

/* Input element i of rank r. */
static double input(int r, size_t i, gocollDataType_t dt, gocollRedOp_t op) {
  double v;
  if (op == gocollProd) {
    v = 1 + (double)((r + i) % 2); /* products of <= 4 ranks stay <= 16 */
  } else {
    v = (double)((r + 1) * (int)(i % 7 + 1)); /* |v| <= 28: sums fit int8 */
  }
  if (is_signed(dt) && (i + (size_t)r) % 3 == 0) v = -v;
  return v;
}

static double reduce_expected(size_t i, gocollDataType_t dt, gocollRedOp_t op, int n) {
  double acc = input(0, i, dt, op);
  int r;
  for (r = 1; r < n; r++) {
    double v = input(r, i, dt, op);
    switch (op) {
      case gocollSum: case gocollAvg: acc += v; break;
      case gocollProd: acc *= v; break;
      case gocollMax: acc = v > acc ? v : acc; break;
      case gocollMin: acc = v < acc ? v : acc; break;
      default: FAIL("bad op");
    }
  }
  if (op == gocollAvg) {
    if (is_float(dt)) acc /= n;
    else acc = (double)((long long)acc / n); /* truncation toward zero, as in C */
  }
  return acc;
}

static void fill(void* buf, size_t count, gocollDataType_t dt, gocollRedOp_t op, int r) {
  size_t i;
  for (i = 0; i < count; i++) store(buf, i, dt, input(r, i, dt, op));
}

static void test_half_patterns(void) {
  /* The converters the checks rely on, against known bit patterns. */
  if (f16_bits(1.0) != 0x3C00 || f16_bits(-2.5) != 0xC100 || f16_bits(28) != 0x4F00 ||
      f16_bits(0.25) != 0x3400 || f16_bits(-0.0) != 0x8000)
    FAIL("float16 converter is wrong");
  if (bf16_bits(1.0) != 0x3F80 || bf16_bits(-2.5) != 0xC020 || bf16_bits(28) != 0x41E0)
    FAIL("bfloat16 converter is wrong");
}

static void test_allreduce(void) {
  const size_t counts[] = {1031, 3};
  int dti, op, ip, ci;
  for (ci = 0; ci < 2; ci++) {
    size_t count = counts[ci];
    for (dti = 0; dti < gocollNumTypes; dti++) {
      gocollDataType_t dt = (gocollDataType_t)dti;
      size_t bytes = count * dtype_size(dt), i;
      char *send, *recv, *want;
      if (!is_number(dt)) continue;
      send = xmalloc(bytes);
      recv = xmalloc(bytes);
      want = xmalloc(bytes);
      for (op = 0; op <= gocollAvg; op++) {
        for (i = 0; i < count; i++) store(want, i, dt, reduce_expected(i, dt, (gocollRedOp_t)op, nranks));
        for (ip = 0; ip < 2; ip++) {
          char* out = ip ? send : recv;
          fill(send, count, dt, (gocollRedOp_t)op, g_rank);
          memset(recv, 0x5a, bytes);
          RUN(gocollAllReduce(send, out, count, dt, (gocollRedOp_t)op, comm),
              gocollIAllReduce(send, out, count, dt, (gocollRedOp_t)op, comm, &rq_));
          expect_equal(ip ? "allreduce in place" : "allreduce", out, want, count, dt);
        }
      }
      free(send);
      free(recv);
      free(want);
    }
  }
  /* count 0: NULL buffers are fine. */
  RUN(gocollAllReduce(NULL, NULL, 0, gocollFloat32, gocollSum, comm),
      gocollIAllReduce(NULL, NULL, 0, gocollFloat32, gocollSum, comm, &rq_));
}

static void test_reduce(void) {
  const size_t count = 257;
  int roots[2] = {0, nranks - 1}, ri, ip;
  gocollDataType_t dts[2] = {gocollFloat32, gocollInt64};
  gocollRedOp_t ops[2] = {gocollSum, gocollMax};
  int k;
  for (k = 0; k < 2; k++) {
    gocollDataType_t dt = dts[k];
    gocollRedOp_t op = ops[k];
    size_t bytes = count * dtype_size(dt), i;
    char* send = xmalloc(bytes);
    char* recv = xmalloc(bytes);
    char* want = xmalloc(bytes);
    for (i = 0; i < count; i++) store(want, i, dt, reduce_expected(i, dt, op, nranks));
    for (ri = 0; ri < 2; ri++) {
      int root = roots[ri];
      for (ip = 0; ip < 2; ip++) {
        /* In place on the root; non-roots pass NULL as recvbuff once. */
        char* out = ip ? (g_rank == root ? send : NULL) : recv;
        fill(send, count, dt, op, g_rank);
        memset(recv, 0x5a, bytes);
        RUN(gocollReduce(send, out, count, dt, op, root, comm),
            gocollIReduce(send, out, count, dt, op, root, comm, &rq_));
        if (g_rank == root) expect_equal("reduce", out, want, count, dt);
      }
    }
    free(send);
    free(recv);
    free(want);
  }
}

static void test_broadcast(void) {
  const size_t count = 1000;
  int roots[2] = {0, nranks - 1}, ri, ip;
  size_t i;
  uint8_t *buf = xmalloc(count), *want = xmalloc(count), *recv = xmalloc(count);
  for (ri = 0; ri < 2; ri++) {
    int root = roots[ri];
    for (i = 0; i < count; i++) want[i] = (uint8_t)(i * 7 + (size_t)root);
    for (ip = 0; ip < 2; ip++) {
      const void* send;
      void* out;
      if (g_rank == root) memcpy(buf, want, count);
      else memset(buf, 0, count);
      memset(recv, 0, count);
      if (ip) { /* in place; non-roots pass NULL as sendbuff */
        send = g_rank == root ? buf : NULL;
        out = buf;
      } else {
        send = buf;
        out = recv;
      }
      RUN(gocollBroadcast(send, out, count, gocollUint8, root, comm),
          gocollIBroadcast(send, out, count, gocollUint8, root, comm, &rq_));
      expect_equal("broadcast", out, want, count, gocollUint8);
    }
  }
  {
    double d[5] = {0}, dw[5] = {1.5, -2.25, 3e100, -0.0, 7};
    if (g_rank == 1 % nranks) memcpy(d, dw, sizeof d);
    RUN(gocollBroadcast(d, d, 5, gocollFloat64, 1 % nranks, comm),
        gocollIBroadcast(d, d, 5, gocollFloat64, 1 % nranks, comm, &rq_));
    expect_equal("broadcast float64", d, dw, 5, gocollFloat64);
  }
  free(buf);
  free(want);
  free(recv);
}

static void test_allgather(void) {
  const size_t count = 129;
  size_t total = count * (size_t)nranks, i;
  int32_t* send = xmalloc(count * 4);
  int32_t* recv = xmalloc(total * 4);
  int32_t* want = xmalloc(total * 4);
  int ip;
  for (i = 0; i < total; i++) want[i] = (int32_t)(1000 * (i / count) + i % count);
  for (ip = 0; ip < 2; ip++) {
    const int32_t* in;
    memset(recv, 0, total * 4);
    if (ip) { /* in place: this rank's block of recvbuff */
      for (i = 0; i < count; i++) recv[(size_t)g_rank * count + i] = (int32_t)(1000 * g_rank + (int)i);
      in = recv + (size_t)g_rank * count;
    } else {
      for (i = 0; i < count; i++) send[i] = (int32_t)(1000 * g_rank + (int)i);
      in = send;
    }
    RUN(gocollAllGather(in, recv, count, gocollInt32, comm),
        gocollIAllGather(in, recv, count, gocollInt32, comm, &rq_));
    expect_equal(ip ? "allgather in place" : "allgather", recv, want, total, gocollInt32);
  }
  free(send);
  free(recv);
  free(want);
}

static void test_reducescatter(void) {
  const size_t count = 65; /* per rank */
  gocollDataType_t dts[2] = {gocollFloat32, gocollBfloat16};
  gocollRedOp_t ops[2] = {gocollSum, gocollAvg};
  int k, ip;
  for (k = 0; k < 2; k++) {
    gocollDataType_t dt = dts[k];
    gocollRedOp_t op = ops[k];
    size_t es = dtype_size(dt), total = count * (size_t)nranks, i;
    char* send = xmalloc(total * es);
    char* recv = xmalloc(count * es);
    char* want = xmalloc(count * es);
    for (i = 0; i < count; i++)
      store(want, i, dt, reduce_expected((size_t)g_rank * count + i, dt, op, nranks));
    for (ip = 0; ip < 2; ip++) {
      char* out = ip ? send + (size_t)g_rank * count * es : recv; /* in place: my block of sendbuff */
      fill(send, total, dt, op, g_rank);
      memset(recv, 0, count * es);
      RUN(gocollReduceScatter(send, out, count, dt, op, comm),
          gocollIReduceScatter(send, out, count, dt, op, comm, &rq_));
      expect_equal(ip ? "reducescatter in place" : "reducescatter", out, want, count, dt);
    }
    free(send);
    free(recv);
    free(want);
  }
}

static void test_alltoall(void) {
  const size_t count = 17;
  size_t total = count * (size_t)nranks, i;
  int64_t* send = xmalloc(total * 8);
  int64_t* recv = xmalloc(total * 8);
  int64_t* want = xmalloc(total * 8);
  int ip;
  /* Element k of the block rank s sends to rank d: s*1e6 + d*1e3 + k. */
  for (i = 0; i < total; i++) want[i] = (int64_t)(i / count) * 1000000 + g_rank * 1000 + (int64_t)(i % count);
  for (ip = 0; ip < 2; ip++) {
    int64_t* out = ip ? send : recv;
    for (i = 0; i < total; i++) send[i] = (int64_t)g_rank * 1000000 + (int64_t)(i / count) * 1000 + (int64_t)(i % count);
    memset(recv, 0, total * 8);
    RUN(gocollAllToAll(send, out, count, gocollInt64, comm),
        gocollIAllToAll(send, out, count, gocollInt64, comm, &rq_));
    expect_equal(ip ? "alltoall in place" : "alltoall", out, want, total, gocollInt64);
  }
  free(send);
  free(recv);
  free(want);
}

/* Rank s sends (s + d) % 3 + d elements to rank d (rank 0 sends itself
 * nothing); blocks sit 2 elements apart in both buffers. */
static size_t vcount(int s, int d) { return (size_t)((s + d) % 3 + d); }

static void test_alltoallv(void) {
  size_t n = (size_t)nranks, i, j, k;
  size_t *sc = xmalloc(n * sizeof(size_t)), *sd = xmalloc(n * sizeof(size_t));
  size_t *rc = xmalloc(n * sizeof(size_t)), *rd = xmalloc(n * sizeof(size_t));
  size_t stotal = 0, rtotal = 0;
  int32_t *send, *recv, *want;
  for (j = 0; j < n; j++) {
    sc[j] = vcount(g_rank, (int)j);
    sd[j] = stotal;
    stotal += sc[j] + 2;
    rc[j] = vcount((int)j, g_rank);
    rd[j] = rtotal;
    rtotal += rc[j] + 2;
  }
  send = xmalloc(stotal * 4);
  recv = xmalloc(rtotal * 4);
  want = xmalloc(rtotal * 4);
  for (i = 0; i < stotal; i++) send[i] = -1;
  for (i = 0; i < rtotal; i++) want[i] = -7;
  for (j = 0; j < n; j++) {
    for (k = 0; k < sc[j]; k++) send[sd[j] + k] = (int32_t)(g_rank * 10000 + (int)j * 100 + (int)k);
    for (k = 0; k < rc[j]; k++) want[rd[j] + k] = (int32_t)((int)j * 10000 + g_rank * 100 + (int)k);
  }
  for (i = 0; i < rtotal; i++) recv[i] = -7;
  RUN(gocollAllToAllv(send, sc, sd, recv, rc, rd, gocollInt32, comm),
      gocollIAllToAllv(send, sc, sd, recv, rc, rd, gocollInt32, comm, &rq_));
  expect_equal("alltoallv", recv, want, rtotal, gocollInt32);
  free(sc); free(sd); free(rc); free(rd);
  free(send); free(recv); free(want);
}

/* Rank s sends rank d vcount(s, d) int32 elements as a vector of single
 * elements three apart; rank d receives them contiguous from even ranks
 * and as runs of one two apart from odd ones. Blocks sit in reverse peer
 * order, displacements in bytes. */
static void test_alltoallw(void) {
  size_t n = (size_t)nranks, i, j, k;
  size_t *sd = xmalloc(n * sizeof(size_t)), *rd = xmalloc(n * sizeof(size_t));
  gocollBlockType_t *st = xmalloc(n * sizeof(gocollBlockType_t)), *rt = xmalloc(n * sizeof(gocollBlockType_t));
  size_t stotal = 0, rtotal = 0; /* elements */
  int32_t *send, *recv, *want;
  for (j = n; j-- > 0;) {
    size_t sc = vcount(g_rank, (int)j), rc = vcount((int)j, g_rank);
    gocollBlockType_t v = {gocollInt32, sc, 1, 3};
    gocollBlockType_t c = {gocollInt32, 1, rc, 0};
    gocollBlockType_t r2 = {gocollInt32, rc, 1, 2};
    st[j] = v;
    sd[j] = stotal * 4;
    stotal += 3 * sc + 1;
    rt[j] = j % 2 == 0 ? c : r2;
    rd[j] = rtotal * 4;
    rtotal += (j % 2 == 0 ? rc : 2 * rc) + 1;
  }
  send = xmalloc(stotal * 4);
  recv = xmalloc(rtotal * 4);
  want = xmalloc(rtotal * 4);
  for (i = 0; i < stotal; i++) send[i] = -1;
  for (i = 0; i < rtotal; i++) want[i] = recv[i] = -7;
  for (j = 0; j < n; j++) {
    for (k = 0; k < vcount(g_rank, (int)j); k++) send[sd[j] / 4 + 3 * k] = (int32_t)(g_rank * 10000 + (int)j * 100 + (int)k);
    for (k = 0; k < vcount((int)j, g_rank); k++)
      want[rd[j] / 4 + (j % 2 == 0 ? k : 2 * k)] = (int32_t)((int)j * 10000 + g_rank * 100 + (int)k);
  }
  RUN(gocollAllToAllw(send, sd, st, recv, rd, rt, comm),
      gocollIAllToAllw(send, sd, st, recv, rd, rt, comm, &rq_));
  expect_equal("alltoallw", recv, want, rtotal, gocollInt32);
  free(sd); free(rd); free(st); free(rt);
  free(send); free(recv); free(want);
}

static void test_sendrecv(void) {
  const size_t count = 333;
  size_t i;
  float *out, *in, *want;
  int next = (g_rank + 1) % nranks, prev = (g_rank + nranks - 1) % nranks;
  if (nranks < 2) return;
  out = xmalloc(count * 4);
  in = xmalloc(count * 4);
  want = xmalloc(count * 4);
  for (i = 0; i < count; i++) {
    out[i] = (float)(g_rank * 1000 + (int)i);
    want[i] = (float)(prev * 1000 + (int)i);
  }
  /* Ring with non-blocking send and receive, both pending at once. */
  {
    gocollRequest_t s = NULL, r = NULL;
    memset(in, 0, count * 4);
    CHECK_COMM(gocollISend(out, count, gocollFloat32, next, comm, &s), comm);
    CHECK_COMM(gocollIRecv(in, count, gocollFloat32, prev, comm, &r), comm);
    if (mode == 2) {
      int ds = 0, dr = 0;
      while (!ds || !dr) {
        if (!ds) CHECK_COMM(gocollTest(s, &ds), comm);
        if (!dr) CHECK_COMM(gocollTest(r, &dr), comm);
        sched_yield();
      }
    } else {
      CHECK_COMM(gocollWait(r), comm);
      CHECK_COMM(gocollWait(s), comm);
    }
    expect_equal("isend/irecv ring", in, want, count, gocollFloat32);
  }
  /* Pairwise exchange 0<->1, 2<->3, ... with the blocking forms (or I-forms). */
  {
    int partner = g_rank ^ 1;
    if (partner < nranks) {
      for (i = 0; i < count; i++) want[i] = (float)(partner * 1000 + (int)i);
      memset(in, 0, count * 4);
      if (g_rank % 2 == 0) {
        RUN(gocollSend(out, count, gocollFloat32, partner, comm),
            gocollISend(out, count, gocollFloat32, partner, comm, &rq_));
        RUN(gocollRecv(in, count, gocollFloat32, partner, comm),
            gocollIRecv(in, count, gocollFloat32, partner, comm, &rq_));
      } else {
        RUN(gocollRecv(in, count, gocollFloat32, partner, comm),
            gocollIRecv(in, count, gocollFloat32, partner, comm, &rq_));
        RUN(gocollSend(out, count, gocollFloat32, partner, comm),
            gocollISend(out, count, gocollFloat32, partner, comm, &rq_));
      }
      expect_equal("send/recv pair", in, want, count, gocollFloat32);
    }
  }
  free(out);
  free(in);
  free(want);
}

/* Tagged messages received in the reverse order of their sends: the tag,
 * not the order, decides which receive gets which message. Small messages,
 * so that the blocking mode's sends complete before anyone receives. */
static void test_sendrecv_tags(void) {
  enum { NA = 10, NB = 20 };
  int32_t a[NA], b[NB], ra[NA], rb[NB], wa[NA], wb[NB];
  int i;
  int next = (g_rank + 1) % nranks, prev = (g_rank + nranks - 1) % nranks;
  if (nranks < 2) return;
  for (i = 0; i < NA; i++) { a[i] = g_rank * 100 + i; wa[i] = prev * 100 + i; ra[i] = -1; }
  for (i = 0; i < NB; i++) { b[i] = -(g_rank * 100 + i); wb[i] = -(prev * 100 + i); rb[i] = -1; }
  if (mode == 0) {
    CHECK_COMM(gocollSendTag(a, NA, gocollInt32, next, 5, comm), comm);
    CHECK_COMM(gocollSendTag(b, NB, gocollInt32, next, 2, comm), comm);
    CHECK_COMM(gocollRecvTag(rb, NB, gocollInt32, prev, 2, comm), comm);
    CHECK_COMM(gocollRecvTag(ra, NA, gocollInt32, prev, 5, comm), comm);
  } else {
    gocollRequest_t rq[4];
    CHECK_COMM(gocollIRecvTag(rb, NB, gocollInt32, prev, 2, comm, &rq[0]), comm);
    CHECK_COMM(gocollIRecvTag(ra, NA, gocollInt32, prev, 5, comm, &rq[1]), comm);
    CHECK_COMM(gocollISendTag(a, NA, gocollInt32, next, 5, comm, &rq[2]), comm);
    CHECK_COMM(gocollISendTag(b, NB, gocollInt32, next, 2, comm, &rq[3]), comm);
    for (i = 0; i < 4; i++) complete(rq[i]);
  }
  expect_equal("recv tag 5", ra, wa, NA, gocollInt32);
  expect_equal("recv tag 2", rb, wb, NB, gocollInt32);
}

/* Receives from any source: every other rank races to send K messages with
 * tag 7 to rank 0 (its rank, then its message number), which takes them
 * with gocollRecvAny (or gocollIRecvAny, all posted at once), and the last
 * one per sender with gocollRecv and GOCOLL_ANY_SOURCE. Every message must
 * come exactly once, from the rank reported, each sender's in order. */
static void test_recv_any(void) {
  enum { K = 5, MAXR = 64 };
  int32_t msg[2], got[K * MAXR][2];
  int src[K * MAXR], next[MAXR], i, k, n = (nranks - 1) * K;
  gocollRequest_t rq[K * MAXR];
  if (nranks < 2 || nranks > MAXR) return;
  if (g_rank != 0) {
    for (k = 0; k <= K; k++) {
      msg[0] = g_rank;
      msg[1] = k;
      CHECK_COMM(gocollSendTag(msg, 2, gocollInt32, 0, k == K ? 0 : 7, comm), comm);
    }
  } else {
    for (i = 0; i < nranks; i++) next[i] = 0;
    for (i = 0; i < n; i++) {
      src[i] = -5;
      if (mode == 0) {
        CHECK_COMM(gocollRecvAny(got[i], 2, gocollInt32, 7, &src[i], comm), comm);
      } else {
        CHECK_COMM(gocollIRecvAny(got[i], 2, gocollInt32, 7, &src[i], comm, &rq[i]), comm);
        /* The header's contract: GOCOLL_ANY_SOURCE until a message was
         * taken, which may already have happened when the call returns. */
        if (src[i] != GOCOLL_ANY_SOURCE && (src[i] < 1 || src[i] >= nranks))
          FAIL("source %d right after posting the receive", src[i]);
      }
    }
    for (i = 0; i < n; i++) {
      if (mode != 0) complete(rq[i]);
      if (src[i] < 1 || src[i] >= nranks) FAIL("receive from any source %d reports rank %d", i, src[i]);
      if (got[i][0] != src[i]) FAIL("message from rank %d reported as from rank %d", (int)got[i][0], src[i]);
      if (got[i][1] != next[src[i]]) FAIL("rank %d's message %d came when %d was due", src[i], (int)got[i][1], next[src[i]]);
      next[src[i]]++;
    }
    for (i = 1; i < nranks; i++) {
      if (next[i] != K) FAIL("%d messages from rank %d, want %d", next[i], i, K);
      CHECK_COMM(gocollRecv(msg, 2, gocollInt32, GOCOLL_ANY_SOURCE, comm), comm);
      if (msg[1] != K || msg[0] < 1 || msg[0] >= nranks) FAIL("tag 0 message %d from rank %d", (int)msg[1], (int)msg[0]);
    }
  }
  CHECK_COMM(gocollBarrier(comm), comm);
}

/* gocollWaitTimeout: rank 0's receive cannot finish before rank 1 sends,
 * which it does only once rank 0 told it that its timed wait returned. */
static void test_wait_timeout(void) {
  int32_t x = 0, go = 1;
  int done = -1;
  gocollRequest_t rq = NULL;
  if (nranks < 2 || g_rank > 1) return;
  if (g_rank == 0) {
    CHECK_COMM(gocollIRecvTag(&x, 1, gocollInt32, 1, 9, comm, &rq), comm);
    if (gocollWaitTimeout(rq, -1, &done) != gocollInvalidArgument) FAIL("gocollWaitTimeout(-1) accepted");
    if (gocollWaitTimeout(NULL, 0, &done) != gocollInvalidArgument) FAIL("gocollWaitTimeout(NULL) accepted");
    CHECK_COMM(gocollWaitTimeout(rq, 50, &done), comm);
    if (done != 0) FAIL("gocollWaitTimeout: done=%d before the message was sent", done);
    CHECK_COMM(gocollSendTag(&go, 1, gocollInt32, 1, 10, comm), comm);
    CHECK_COMM(gocollWaitTimeout(rq, 60000, &done), comm);
    if (done != 1 || x != 42) FAIL("gocollWaitTimeout: done=%d x=%d, want 1 and 42", done, (int)x);
  } else {
    CHECK_COMM(gocollRecvTag(&go, 1, gocollInt32, 0, 10, comm), comm);
    x = 42;
    CHECK_COMM(gocollSendTag(&x, 1, gocollInt32, 0, 9, comm), comm);
  }
}

static void test_barrier(void) {
  RUN(gocollBarrier(comm), gocollIBarrier(comm, &rq_));
}

/* Several operations in flight at once, completed in reverse order. */
static void test_outstanding(void) {
  enum { K = 4, N = 100 };
  int32_t buf[K][N], want[N];
  gocollRequest_t req[K];
  int k, i;
  for (i = 0; i < N; i++) want[i] = (int32_t)(nranks * (nranks + 1) / 2 * i);
  for (k = 0; k < K; k++) {
    for (i = 0; i < N; i++) buf[k][i] = (g_rank + 1) * i;
    CHECK_COMM(gocollIAllReduce(buf[k], buf[k], N, gocollInt32, gocollSum, comm, &req[k]), comm);
  }
  for (k = K - 1; k >= 0; k--) {
    CHECK_COMM(gocollWait(req[k]), comm);
    expect_equal("outstanding allreduce", buf[k], want, N, gocollInt32);
  }
}

static void test_split(void) {
  gocollComm_t sub = NULL, none = NULL;
  int color = g_rank % 2, subrank = -1, subsize = -1, expect_rank = 0, expect_size = 0, r;
  int32_t v, sum = 0;
  /* key = -rank: the order inside each colour is reversed. */
  CHECK_COMM(gocollCommSplit(comm, color, -g_rank, &sub), comm);
  if (sub == NULL) FAIL("split gave no communicator");
  for (r = 0; r < nranks; r++) {
    if (r % 2 != color) continue;
    expect_size++;
    sum += r;
    if (r > g_rank) expect_rank++;
  }
  CHECK_COMM(gocollCommCount(sub, &subsize), sub);
  CHECK_COMM(gocollCommUserRank(sub, &subrank), sub);
  if (subsize != expect_size || subrank != expect_rank)
    FAIL("split: rank %d of %d, want %d of %d", subrank, subsize, expect_rank, expect_size);
  v = g_rank;
  RUN(gocollAllReduce(&v, &v, 1, gocollInt32, gocollSum, sub),
      gocollIAllReduce(&v, &v, 1, gocollInt32, gocollSum, sub, &rq_));
  if (v != sum) FAIL("split allreduce: %d, want %d", v, sum);
  CHECK_COMM(gocollCommDestroy(sub), NULL);
  /* The last rank opts out. */
  CHECK_COMM(gocollCommSplit(comm, g_rank == nranks - 1 ? GOCOLL_SPLIT_NOCOLOR : 0, 0, &none), comm);
  if ((g_rank == nranks - 1) != (none == NULL)) FAIL("split with GOCOLL_SPLIT_NOCOLOR");
  if (none != NULL) {
    CHECK_COMM(gocollBarrier(none), none);
    CHECK_COMM(gocollCommDestroy(none), NULL);
  }
}

static void test_memalloc(void) {
  const size_t count = 4096;
  float* p = NULL;
  size_t i;
  CHECK_COMM(gocollMemAlloc((void**)&p, count * sizeof(float), comm), comm);
  if (p == NULL || ((uintptr_t)p & 4095) != 0) FAIL("gocollMemAlloc: %p is not page aligned", (void*)p);
  for (i = 0; i < count; i++) p[i] = (float)(g_rank + 1);
  RUN(gocollAllReduce(p, p, count, gocollFloat32, gocollSum, comm),
      gocollIAllReduce(p, p, count, gocollFloat32, gocollSum, comm, &rq_));
  for (i = 0; i < count; i++)
    if (p[i] != (float)(nranks * (nranks + 1) / 2)) FAIL("memalloc allreduce: %g", p[i]);
  CHECK_COMM(gocollMemFree(p, comm), comm);
}

static void join_uid(int rank, int n) {
  gocollUniqueId id;
  int i;
  if (rank == 0) {
    CHECK(gocollGetUniqueId(&id));
    printf("UID ");
    for (i = 0; i < GOCOLL_UNIQUE_ID_BYTES; i++) printf("%02x", (unsigned char)id.internal[i]);
    printf("\n");
    fflush(stdout);
  } else {
    char line[2 * GOCOLL_UNIQUE_ID_BYTES + 16];
    if (!fgets(line, sizeof line, stdin) || strncmp(line, "UID ", 4) != 0) FAIL("no UID line on stdin");
    for (i = 0; i < GOCOLL_UNIQUE_ID_BYTES; i++) {
      unsigned x;
      if (sscanf(line + 4 + 2 * i, "%2x", &x) != 1) FAIL("bad UID line");
      id.internal[i] = (char)x;
    }
  }
  CHECK(gocollCommInitRank(&comm, n, id, rank));
}

/* The topology text: ask for the size, then fetch it; it names this rank,
 * every rank and the hosts. */
static void test_topology(void) {
  size_t need = 0, again = 0;
  CHECK_COMM(gocollCommGetTopology(comm, NULL, 0, &need), comm);
  char* text = malloc(need);
  if (!text) FAIL("malloc");
  CHECK_COMM(gocollCommGetTopology(comm, text, need, &again), comm);
  if (again != need || strlen(text) + 1 != need) FAIL("topology: %zu then %zu bytes, text of %zu", need, again, strlen(text));
  char want[64];
  snprintf(want, sizeof want, "\"rank\":%d,\"ranks\":%d,", g_rank, nranks);
  if (!strstr(text, want) || !strstr(text, "\"hosts\":") || !strstr(text, "\"links\":")) FAIL("topology text: %.300s", text);
  free(text);
}

/* The flight recorder's dump: a file whose path comes back, holding JSON
 * with this rank and the collectives just run; a path buffer too small is
 * refused, NULL with length 0 only writes. */
static void test_dump_state(void) {
  char path[4096], small[8], want[32];
  CHECK_COMM(gocollCommDumpState(comm, path, sizeof path), comm);
  FILE* f = fopen(path, "r");
  if (!f) FAIL("dump %s: cannot open", path);
  static char text[1 << 20];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  snprintf(want, sizeof want, "\"rank\": %d,", g_rank);
  if (n == 0 || text[0] != '{' || !strstr(text, want) || !strstr(text, "\"records\": [") ||
      !strstr(text, "\"op\": \"allreduce\"") || !strstr(text, "\"state\": \"ok\"") || !strstr(text, "\"in_flight\": ["))
    FAIL("dump %s: %.300s", path, text);
  if (!strstr(path, "gocoll-dump-")) FAIL("dump path %s", path);
  if (gocollCommDumpState(comm, small, sizeof small) != gocollInvalidArgument) FAIL("8-byte path buffer accepted");
  if (gocollCommDumpState(comm, NULL, 16) != gocollInvalidArgument) FAIL("NULL path with len 16 accepted");
  CHECK_COMM(gocollCommDumpState(comm, NULL, 0), comm);
  if (gocollCommDumpState(NULL, path, sizeof path) != gocollInvalidArgument) FAIL("NULL comm accepted");
}

int main(int argc, char** argv) {
  int version = 0, count = 0, rank = -1;
  gocollResult_t async = gocollInternalError;
  double t0 = now_seconds();
  const char* envrank = getenv("RANK");
  if (!envrank) envrank = getenv("OMPI_COMM_WORLD_RANK");

  setvbuf(stderr, NULL, _IONBF, 0);
  CHECK(gocollGetVersion(&version));
  if (version != GOCOLL_VERSION_CODE) FAIL("library version %d, header %d", version, GOCOLL_VERSION_CODE);
  test_half_patterns();

  if (argc >= 5 && strcmp(argv[1], "setenv") == 0) {
    /* The launcher variables appear only after the library was loaded (as
     * when Python sets os.environ before init): gocoll must still see them. */
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", argv[4], 1);
    setenv("RANK", argv[2], 1);
    setenv("WORLD_SIZE", argv[3], 1);
    setenv("LOCAL_RANK", argv[2], 1);
    setenv("LOCAL_WORLD_SIZE", argv[3], 1);
    envrank = argv[2];
    CHECK(gocollCommInitFromEnv(&comm));
  } else if (argc >= 2 && strcmp(argv[1], "env") == 0) {
    CHECK(gocollCommInitFromEnv(&comm));
  } else if (argc >= 4 && strcmp(argv[1], "uid") == 0) {
    join_uid(atoi(argv[2]), atoi(argv[3]));
  } else {
    fprintf(stderr, "usage: %s env | uid RANK NRANKS | setenv RANK NRANKS PORT\n", argv[0]);
    return 64;
  }
  CHECK_COMM(gocollCommCount(comm, &count), comm);
  CHECK_COMM(gocollCommUserRank(comm, &rank), comm);
  g_rank = rank;
  nranks = count;
  if (envrank && atoi(envrank) != rank) FAIL("user rank %d but launcher rank %s", rank, envrank);
  if (argc >= 4 && strcmp(argv[1], "env") != 0 && (rank != atoi(argv[2]) || count != atoi(argv[3]))) FAIL("rank/size mismatch");

  for (mode = 0; mode < 3; mode++) {
    double t = now_seconds();
    test_allreduce();
    test_reduce();
    test_broadcast();
    test_allgather();
    test_reducescatter();
    test_alltoall();
    test_alltoallv();
    test_alltoallw();
    test_sendrecv();
    test_sendrecv_tags();
    test_recv_any();
    test_barrier();
    test_memalloc();
    if (rank == 0) fprintf(stderr, "mode %s: %.2fs\n", mode_names[mode], now_seconds() - t);
  }
  test_topology();
  test_dump_state();
  mode = 1;
  test_outstanding();
  test_wait_timeout();
  test_split();

  CHECK_COMM(gocollCommGetAsyncError(comm, &async), comm);
  if (async != gocollSuccess) FAIL("async error %d", (int)async);
  CHECK_COMM(gocollBarrier(comm), comm);
  CHECK_COMM(gocollCommDestroy(comm), NULL);
  printf("OK rank %d of %d (%.2fs)\n", rank, count, now_seconds() - t0);
  return 0;
}
