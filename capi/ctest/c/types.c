/* The types and ops added for torch: int16 and bool, and the bitwise ops
 * gocollBand/Bor/Bxor, through allreduce, reduce and reducescatter on every
 * rank; and the pairs that are refused (bitwise ops on floating types, avg
 * on bool) with gocollInvalidArgument, on every rank alike, the
 * communicator working on afterwards.
 *
 *   types env      join through the launcher environment (torchrun variables)
 *
 * Expectations are computed here with plain C arithmetic on values every
 * rank can recompute for every other. Prints "OK rank R of N". */
#include <stdbool.h>

#include "common.h"

static gocollComm_t comm;
static int nranks;

static const gocollDataType_t int_types[] = {gocollInt8, gocollUint8, gocollInt16, gocollInt32,
                                             gocollUint32, gocollInt64, gocollUint64};
static const gocollDataType_t float_types[] = {gocollFloat16, gocollFloat32, gocollFloat64, gocollBfloat16};
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static uint64_t mix(uint64_t x) { /* splitmix64 */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Raw bits of element i of rank r: all 64 bits random (stored truncated). */
static uint64_t bits_of(int r, size_t i, int salt) { return mix((uint64_t)r * 1000003u + i * 7919u + (uint64_t)salt); }

static void put_bits(void* buf, size_t i, gocollDataType_t dt, uint64_t v) {
  memcpy((char*)buf + i * dtype_size(dt), &v, dtype_size(dt)); /* little-endian: the low bytes */
}

/* int16 arithmetic, wrapping like torch's int16 (and C's unsigned math). */
static int16_t wrap16(int64_t v) { return (int16_t)(uint16_t)(uint64_t)v; }

static int16_t i16_input(int r, size_t i, gocollRedOp_t op) {
  uint64_t h = bits_of(r, i, 16);
  if (op == gocollProd) return (int16_t)(h % 301) - 150; /* products of a few wrap */
  if (op == gocollAvg) return (int16_t)(h % 2001) - 1000;
  return (int16_t)(uint16_t)h; /* all patterns: sums wrap */
}

static int16_t i16_expected(size_t i, gocollRedOp_t op) {
  int64_t acc = i16_input(0, i, op);
  int r;
  for (r = 1; r < nranks; r++) {
    int64_t v = i16_input(r, i, op);
    switch (op) {
      case gocollSum: case gocollAvg: acc = wrap16(acc + v); break;
      case gocollProd: acc = wrap16(acc * v); break;
      case gocollMax: acc = v > acc ? v : acc; break;
      case gocollMin: acc = v < acc ? v : acc; break;
      default: FAIL("i16_expected: op %d", (int)op);
    }
  }
  if (op == gocollAvg) acc /= nranks; /* truncation toward zero, as in C */
  return (int16_t)acc;
}

/* Bool inputs: 0, 1 and bytes other than 1 that are true too. */
static uint8_t bool_input(int r, size_t i) {
  static const uint8_t vals[] = {0, 1, 2, 0x80, 0, 0xff, 1};
  return vals[bits_of(r, i, 2) % LEN(vals)];
}

static uint8_t bool_expected(size_t i, gocollRedOp_t op) {
  bool acc = bool_input(0, i) != 0;
  int r;
  for (r = 1; r < nranks; r++) {
    bool v = bool_input(r, i) != 0;
    switch (op) {
      case gocollSum: case gocollMax: case gocollBor: acc = acc || v; break;
      case gocollProd: case gocollMin: case gocollBand: acc = acc && v; break;
      case gocollBxor: acc = acc != v; break;
      default: FAIL("bool_expected: op %d", (int)op);
    }
  }
  return acc ? 1 : 0;
}

static uint64_t bitwise_expected(size_t i, gocollRedOp_t op) {
  uint64_t acc = bits_of(0, i, 1);
  int r;
  for (r = 1; r < nranks; r++) {
    uint64_t v = bits_of(r, i, 1);
    acc = op == gocollBand ? acc & v : op == gocollBor ? acc | v : acc ^ v;
  }
  return acc;
}

/* fill / expect write element i of this rank's input / of the result. */
static void fill(void* buf, size_t first, size_t count, gocollDataType_t dt, gocollRedOp_t op, int r) {
  size_t i;
  for (i = 0; i < count; i++) {
    size_t k = first + i;
    if (dt == gocollBool) ((uint8_t*)buf)[i] = bool_input(r, k);
    else if (op == gocollBand || op == gocollBor || op == gocollBxor) put_bits(buf, i, dt, bits_of(r, k, 1));
    else if (dt == gocollInt16) ((int16_t*)buf)[i] = i16_input(r, k, op);
    else FAIL("fill: %s/%d", dtype_name(dt), (int)op);
  }
}

static void expect(void* buf, size_t first, size_t count, gocollDataType_t dt, gocollRedOp_t op) {
  size_t i;
  for (i = 0; i < count; i++) {
    size_t k = first + i;
    if (dt == gocollBool) ((uint8_t*)buf)[i] = bool_expected(k, op);
    else if (op == gocollBand || op == gocollBor || op == gocollBxor) put_bits(buf, i, dt, bitwise_expected(k, op));
    else ((int16_t*)buf)[i] = i16_expected(k, op);
  }
}

/* One (type, op) through allreduce (out of place, in place, I-form),
 * reduce to the last rank and reducescatter. */
static void check_pair(gocollDataType_t dt, gocollRedOp_t op) {
  const size_t count = 1031; /* vector loops and tails */
  size_t es = dtype_size(dt), total = count * (size_t)nranks;
  char *send = xmalloc(total * es), *recv = xmalloc(total * es), *want = xmalloc(total * es);
  char what[96];
  gocollRequest_t req = NULL;
  int root = nranks - 1;
  snprintf(what, sizeof what, "%s %d", dtype_name(dt), (int)op);

  expect(want, 0, count, dt, op);
  fill(send, 0, count, dt, op, g_rank);
  memset(recv, 0x5a, count * es);
  CHECK_COMM(gocollAllReduce(send, recv, count, dt, op, comm), comm);
  expect_equal(what, recv, want, count, dt);
  CHECK_COMM(gocollAllReduce(send, send, count, dt, op, comm), comm);
  expect_equal(what, send, want, count, dt);
  fill(send, 0, count, dt, op, g_rank);
  CHECK_COMM(gocollIAllReduce(send, recv, count, dt, op, comm, &req), comm);
  CHECK_COMM(gocollWait(req), comm);
  expect_equal(what, recv, want, count, dt);

  memset(recv, 0x5a, count * es);
  CHECK_COMM(gocollReduce(send, recv, count, dt, op, root, comm), comm);
  if (g_rank == root) expect_equal(what, recv, want, count, dt);

  fill(send, 0, total, dt, op, g_rank);
  expect(want, (size_t)g_rank * count, count, dt, op);
  CHECK_COMM(gocollReduceScatter(send, recv, count, dt, op, comm), comm);
  expect_equal(what, recv, want, count, dt);
  free(send);
  free(recv);
  free(want);
}

/* A refused pair fails with gocollInvalidArgument in every reducing call,
 * and the text names the op. */
static void check_refused(gocollDataType_t dt, gocollRedOp_t op, const char* opname) {
  char buf[64 * 8], out[64 * 8];
  gocollRequest_t req = NULL;
  gocollResult_t rc;
  memset(buf, 0, sizeof buf);
#define REFUSED(call)                                                                              \
  do {                                                                                             \
    rc = (call);                                                                                   \
    if (rc != gocollInvalidArgument) FAIL("%s on %s: %d, want gocollInvalidArgument", #call, dtype_name(dt), (int)rc); \
    if (!strstr(gocollGetLastError(comm), opname)) FAIL("%s: text does not name %s: %s", #call, opname, gocollGetLastError(comm)); \
  } while (0)
  REFUSED(gocollAllReduce(buf, out, 4, dt, op, comm));
  REFUSED(gocollIAllReduce(buf, buf, 4, dt, op, comm, &req));
  REFUSED(gocollReduce(buf, out, 4, dt, op, 0, comm));
  REFUSED(gocollReduceScatter(buf, out, 2, dt, op, comm));
#undef REFUSED
  if (req != NULL) FAIL("a refused call made a request");
}

int main(int argc, char** argv) {
  size_t t, o;
  int32_t v;
  const gocollRedOp_t int_ops[] = {gocollSum, gocollProd, gocollMax, gocollMin, gocollAvg};
  const gocollRedOp_t bit_ops[] = {gocollBand, gocollBor, gocollBxor};
  const gocollRedOp_t bool_ops[] = {gocollSum, gocollProd, gocollMax, gocollMin, gocollBand, gocollBor, gocollBxor};
  const char* bit_names[] = {"band", "bor", "bxor"};
  int count = 0;

  setvbuf(stderr, NULL, _IONBF, 0);
  if (argc < 2 || strcmp(argv[1], "env") != 0) {
    fprintf(stderr, "usage: %s env\n", argv[0]);
    return 64;
  }
  if (gocollInt16 != 12 || gocollBool != 13 || gocollBand != 5 || gocollBor != 6 || gocollBxor != 7)
    FAIL("enum values changed");
  CHECK(gocollCommInitFromEnv(&comm));
  CHECK_COMM(gocollCommCount(comm, &nranks), comm);
  CHECK_COMM(gocollCommUserRank(comm, &g_rank), comm);

  for (o = 0; o < LEN(int_ops); o++) check_pair(gocollInt16, int_ops[o]);
  for (t = 0; t < LEN(int_types); t++)
    for (o = 0; o < LEN(bit_ops); o++) check_pair(int_types[t], bit_ops[o]);
  for (o = 0; o < LEN(bool_ops); o++) check_pair(gocollBool, bool_ops[o]);

  for (t = 0; t < LEN(float_types); t++)
    for (o = 0; o < LEN(bit_ops); o++) check_refused(float_types[t], bit_ops[o], bit_names[o]);
  check_refused(gocollBool, gocollAvg, "avg");
  /* 10 and 11 (NCCL's float8) are no types here. */
  if (gocollAllReduce(&v, &v, 1, (gocollDataType_t)10, gocollSum, comm) != gocollInvalidArgument ||
      gocollAllReduce(&v, &v, 1, (gocollDataType_t)11, gocollSum, comm) != gocollInvalidArgument)
    FAIL("datatype 10 or 11 accepted");

  /* Nothing was sent by the refused calls: the ranks are still in step. */
  v = g_rank + 1;
  CHECK_COMM(gocollAllReduce(&v, &v, 1, gocollInt32, gocollSum, comm), comm);
  if (v != nranks * (nranks + 1) / 2) FAIL("allreduce after refusals: %d", v);
  CHECK_COMM(gocollCommCount(comm, &count), comm);
  CHECK_COMM(gocollCommDestroy(comm), NULL);
  printf("OK rank %d of %d\n", g_rank, count);
  return 0;
}
