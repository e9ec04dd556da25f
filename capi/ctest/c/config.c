/* gocollConfig_t: per-communicator settings.
 *
 *   config env DIR   join through the launcher environment (torchrun
 *                    variables, GOCOLL_TIMEOUT in the environment); DIR is
 *                    an empty directory for one communicator's dumps
 *
 * 1. A config whose header is wrong (size, magic, version) or whose fields
 *    hold values their variables would not take is refused with
 *    gocollInvalidArgument naming the field, before any rendezvous.
 * 2. A base communicator from gocollCommInitFromEnvConfig hands out three
 *    unique ids; every rank joins A (timeoutMs 300), B (timeoutMs 10 min,
 *    algo allreduce=rd, dumpDir DIR) and C (config NULL: the environment's
 *    GOCOLL_TIMEOUT) with gocollCommInitRankConfig.
 * 3. Rank 0 starts an allreduce on B, then one on A that no other rank
 *    joins: A times out (gocollTimeout). Only then (a barrier on C) do the
 *    other ranks join B, which has waited as long as A did and more, and
 *    completes. A dump of B shows its own algorithm and lands in DIR.
 * Prints "OK rank R of N". */
#include <limits.h>

#include "common.h"

static gocollConfig_t fresh(void) {
  gocollConfig_t c = GOCOLL_CONFIG_INITIALIZER;
  return c;
}

/* expect_refused: init with config c fails with gocollInvalidArgument, the
 * text contains want, and *comm is left alone. */
static void expect_refused(const char* what, const gocollConfig_t* c, const char* want) {
  gocollComm_t comm = (gocollComm_t)(uintptr_t)0x1234;
  gocollUniqueId id;
  gocollResult_t rc;
  memset(&id, 0, sizeof id);
  rc = gocollCommInitRankConfig(&comm, 2, id, 0, c);
  if (rc != gocollInvalidArgument) FAIL("%s: InitRankConfig returned %d, want gocollInvalidArgument", what, (int)rc);
  if (!strstr(gocollGetLastError(NULL), want)) FAIL("%s: text does not say %s: %s", what, want, gocollGetLastError(NULL));
  if (comm != (gocollComm_t)(uintptr_t)0x1234) FAIL("%s: comm written on failure", what);
  comm = (gocollComm_t)(uintptr_t)0x1234;
  rc = gocollCommInitFromEnvConfig(&comm, c);
  if (rc != gocollInvalidArgument) FAIL("%s: InitFromEnvConfig returned %d, want gocollInvalidArgument", what, (int)rc);
  if (comm != (gocollComm_t)(uintptr_t)0x1234) FAIL("%s: comm written on failure", what);
}

static void test_validation(void) {
  gocollConfig_t c;
  gocollUniqueId id;
  gocollComm_t tmp = NULL;
  c = fresh();
  if (c.size != sizeof(gocollConfig_t) || c.magic != GOCOLL_CONFIG_MAGIC || c.version != GOCOLL_CONFIG_VERSION ||
      c.timeoutMs != GOCOLL_CONFIG_UNDEF_INT || c.algo != NULL || c.flightRecords != GOCOLL_CONFIG_UNDEF_INT ||
      GOCOLL_CONFIG_UNDEF_INT != INT_MIN)
    FAIL("GOCOLL_CONFIG_INITIALIZER");
  c.size = sizeof(gocollConfig_t) - 1;
  expect_refused("size - 1", &c, "size");
  c.size = 4;
  expect_refused("size 4", &c, "size");
  c = fresh();
  c.size = sizeof(gocollConfig_t) + 8;
  expect_refused("size + 8", &c, "size");
  c = fresh();
  c.magic = 0xcafebeef;
  expect_refused("magic", &c, "magic");
  c = fresh();
  c.version = GOCOLL_CONFIG_VERSION + 1;
  expect_refused("newer version", &c, "version");
  c.version = 0;
  expect_refused("version 0", &c, "version");
  c = fresh();
  c.timeoutMs = 0;
  expect_refused("timeoutMs 0", &c, "timeoutMs");
  c.timeoutMs = -5;
  expect_refused("timeoutMs -5", &c, "timeoutMs");
  c = fresh();
  c.algo = "allreduce=bogus";
  expect_refused("algo", &c, "gocollConfig_t.algo");
  c = fresh();
  c.debug = "LOUD";
  expect_refused("debug", &c, "gocollConfig_t.debug");
  c = fresh();
  c.transport = "rdma";
  expect_refused("transport", &c, "gocollConfig_t.transport");
  c = fresh();
  c.cma = 5;
  expect_refused("cma", &c, "gocollConfig_t.cma");
  c = fresh();
  c.bruckRadix = 1;
  expect_refused("bruckRadix", &c, "gocollConfig_t.bruckRadix");
  c = fresh();
  c.flightRecords = -1;
  expect_refused("flightRecords", &c, "gocollConfig_t.flightRecords");
  c = fresh();
  c.netBandwidth = "fast";
  expect_refused("netBandwidth", &c, "gocollConfig_t.netBandwidth");
  memset(&id, 0, sizeof id);
  c = fresh();
  if (gocollCommInitRankConfig(NULL, 2, id, 0, &c) != gocollInvalidArgument) FAIL("comm NULL accepted");
  if (gocollCommInitFromEnvConfig(NULL, &c) != gocollInvalidArgument) FAIL("comm NULL accepted (env)");
  if (gocollCommInitRankConfig(&tmp, 2, id, 2, &c) != gocollInvalidArgument) FAIL("rank 2 of 2 accepted");
}

/* Rank 0 makes a unique id; the base communicator carries it to the others. */
static gocollUniqueId share_id(gocollComm_t base) {
  gocollUniqueId id;
  memset(&id, 0, sizeof id);
  if (g_rank == 0) CHECK(gocollGetUniqueId(&id));
  CHECK_COMM(gocollBroadcast(&id, &id, sizeof id, gocollUint8, 0, base), base);
  return id;
}

int main(int argc, char** argv) {
  gocollComm_t base = NULL, a = NULL, b = NULL, c = NULL;
  gocollConfig_t cfg;
  gocollUniqueId ida, idb, idc;
  gocollRequest_t req = NULL;
  gocollResult_t rc;
  int nranks = 0, i;
  float x[4], ya[4];
  char path[4096];
  const char* dir;

  setvbuf(stderr, NULL, _IONBF, 0);
  if (argc < 3 || strcmp(argv[1], "env") != 0) {
    fprintf(stderr, "usage: %s env DIR\n", argv[0]);
    return 64;
  }
  dir = argv[2];
  g_rank = atoi(getenv("RANK") ? getenv("RANK") : "-1");
  test_validation();

  cfg = fresh();
  cfg.algo = "allreduce=ring";
  cfg.debug = "OFF";
  CHECK(gocollCommInitFromEnvConfig(&base, &cfg));
  CHECK_COMM(gocollCommCount(base, &nranks), base);
  CHECK_COMM(gocollCommUserRank(base, &g_rank), base);
  if (nranks < 2) FAIL("needs 2 ranks or more");

  ida = share_id(base);
  idb = share_id(base);
  idc = share_id(base);
  cfg = fresh();
  cfg.timeoutMs = 300;
  CHECK(gocollCommInitRankConfig(&a, nranks, ida, g_rank, &cfg));
  cfg = fresh();
  cfg.timeoutMs = 10 * 60 * 1000;
  cfg.algo = "allreduce=rd";
  cfg.dumpDir = dir;
  CHECK(gocollCommInitRankConfig(&b, nranks, idb, g_rank, &cfg));
  CHECK(gocollCommInitRankConfig(&c, nranks, idc, g_rank, NULL));

  for (i = 0; i < 4; i++) x[i] = (float)(g_rank + 1) * (float)(i + 1);
  if (g_rank == 0) {
    CHECK_COMM(gocollIAllReduce(x, x, 4, gocollFloat32, gocollSum, b, &req), b);
    rc = gocollAllReduce(ya, ya, 4, gocollFloat32, gocollSum, a);
    if (rc != gocollTimeout) FAIL("A (timeoutMs 300) returned %d (%s), want gocollTimeout", (int)rc, gocollGetLastError(a));
    fprintf(stderr, "rank 0: A timed out as it should: %s\n", gocollGetLastError(a));
    CHECK_COMM(gocollBarrier(c), c);
    CHECK_COMM(gocollWait(req), b);
  } else {
    CHECK_COMM(gocollBarrier(c), c); /* after A timed out on rank 0 */
    CHECK_COMM(gocollAllReduce(x, x, 4, gocollFloat32, gocollSum, b), b);
  }
  for (i = 0; i < 4; i++)
    if (x[i] != (float)(nranks * (nranks + 1) / 2 * (i + 1))) FAIL("B's allreduce: x[%d] = %g", i, x[i]);

  /* B's own settings: its algorithm in its records, its dump directory. */
  CHECK_COMM(gocollCommDumpState(b, path, sizeof path), b);
  if (strncmp(path, dir, strlen(dir)) != 0) FAIL("B's dump %s is not in its dumpDir %s", path, dir);
  {
    static char text[1 << 20];
    size_t n;
    FILE* f = fopen(path, "r");
    if (!f) FAIL("cannot open %s", path);
    n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    if (!strstr(text, "\"algo\": \"rd\"")) FAIL("B's dump names no rd allreduce: %.400s", text);
  }

  CHECK_COMM(gocollCommAbort(a), NULL); /* failed on rank 0; never used elsewhere */
  CHECK_COMM(gocollBarrier(c), c);
  CHECK_COMM(gocollCommDestroy(b), NULL);
  CHECK_COMM(gocollCommDestroy(c), NULL);
  CHECK_COMM(gocollBarrier(base), base);
  CHECK_COMM(gocollCommDestroy(base), NULL);
  printf("OK rank %d of %d\n", g_rank, nranks);
  return 0;
}
