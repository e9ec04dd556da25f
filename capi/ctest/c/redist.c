/* Redistributes arrays between layouts through gocoll.h's plans and checks
 * every element: the block-cyclic case of docs/design/redistribution.md with an affine loop, and
 * a 2-D resource map into another. Run with the launcher environment
 * (collectives env); prints "OK rank R of N".
 *
 *   redist env */
#include "common.h"

static gocollComm_t comm;
static int rank, nranks;

/* The element a processor holds at local offset off of a block-cyclic(b)
 * layout over p processors: its blocks back to back. */
static long cyclic_global(long proc, long off, long b, long p) { return (off / b * p + proc) * b + off % b; }

static void test_cyclic(void) {
  /* A(3i+4) = B(2i+1), i < 600; B cyclic(3) over nranks, A cyclic(4) over nranks. */
  const long n = 600;
  gocollPlan_t plan;
  CHECK_COMM(gocollPlanCyclic(&plan, nranks, 3, nranks, 4, 2, 1, 3, 4, (size_t)n), NULL);
  size_t ns = 0, nd = 0;
  CHECK_COMM(gocollPlanCounts(plan, rank, &ns, &nd), NULL);
  double* src = malloc((ns + 1) * sizeof(double));
  double* dst = malloc((nd + 1) * sizeof(double));
  for (size_t k = 0; k < ns; k++) src[k] = (double)cyclic_global(rank, (long)k, 3, nranks);
  for (size_t k = 0; k < nd; k++) dst[k] = -1;
  CHECK_COMM(gocollRedistribute(plan, src, dst, gocollFloat64, comm), comm);
  for (size_t k = 0; k < nd; k++) {
    long g = cyclic_global(rank, (long)k, 4, nranks); /* A's index */
    double want = -1;
    if (g >= 4 && (g - 4) % 3 == 0 && (g - 4) / 3 < n) want = (double)(2 * ((g - 4) / 3) + 1);
    if (dst[k] != want) FAIL("A[%ld] = %g, want %g", g, dst[k], want);
  }
  size_t need = 0;
  CHECK_COMM(gocollPlanGetJSON(plan, NULL, 0, &need), NULL);
  char* text = malloc(need);
  CHECK_COMM(gocollPlanGetJSON(plan, text, need, &need), NULL);
  if (!strstr(text, "\"com\":") || !strstr(text, "\"steps\":")) FAIL("plan JSON: %.200s", text);
  free(text);
  CHECK_COMM(gocollPlanDestroy(plan), NULL);
  if (gocollPlanDestroy(plan) != gocollInvalidUsage) FAIL("destroying a plan twice");
  free(src);
  free(dst);
}

static void test_maps(void) {
  /* 30x20 floats: rows in blocks over every rank, to 4x4 tiles dealt cyclically. */
  size_t extent[2] = {30, 20}, rows[2] = {1, 0}, tiles[2] = {4, 4};
  gocollMap_t a = {2, extent, rows, nranks, gocollMapBlocks, NULL};
  gocollMap_t b = {2, extent, tiles, nranks, gocollMapCyclic, NULL};
  gocollPlan_t plan;
  CHECK_COMM(gocollPlanMaps(&plan, &a, &b), NULL);
  size_t ns = 0, nd = 0;
  CHECK_COMM(gocollPlanCounts(plan, rank, &ns, &nd), NULL);
  float* src = malloc((ns + 1) * sizeof(float));
  float* dst = malloc((nd + 1) * sizeof(float));
  /* Row blocks: rank r holds rows [r*30/n, (r+1)*30/n) in order. */
  long r0 = (long)rank * 30 / nranks;
  for (size_t k = 0; k < ns; k++) src[k] = (float)(r0 * 20 + (long)k);
  CHECK_COMM(gocollRedistribute(plan, src, dst, gocollFloat32, comm), comm);
  /* Tiles t = rank, rank+n, … (8 tiles per row of tiles: 5 across, 8 down), each row-major. */
  size_t k = 0;
  for (long t = rank; t < 8 * 5; t += nranks) {
    long ti = t / 5, tj = t % 5;
    for (long i = ti * 4; i < ti * 4 + 4 && i < 30; i++)
      for (long j = tj * 4; j < tj * 4 + 4 && j < 20; j++, k++)
        if (dst[k] != (float)(i * 20 + j)) FAIL("element (%ld,%ld) = %g", i, j, dst[k]);
  }
  if (k != nd) FAIL("%zu elements checked, %zu held", k, nd);
  gocollMap_t bad = {2, extent, tiles, 0, gocollMapCyclic, NULL};
  gocollPlan_t none;
  if (gocollPlanMaps(&none, &a, &bad) != gocollInvalidArgument) FAIL("a map of 0 devices was accepted");
  if (gocollRedistribute(plan, NULL, dst, gocollFloat32, comm) != (ns ? gocollInvalidArgument : gocollSuccess))
    FAIL("a NULL source buffer was not refused");
  CHECK_COMM(gocollPlanDestroy(plan), NULL);
  free(src);
  free(dst);
}

int main(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "env") != 0) {
    fprintf(stderr, "usage: %s env\n", argv[0]);
    return 64;
  }
  CHECK(gocollCommInitFromEnv(&comm));
  CHECK_COMM(gocollCommCount(comm, &nranks), comm);
  CHECK_COMM(gocollCommUserRank(comm, &rank), comm);
  g_rank = rank;
  test_cyclic();
  test_maps();
  CHECK_COMM(gocollCommDestroy(comm), NULL);
  printf("OK rank %d of %d\n", rank, nranks);
  return 0;
}
