/* Create/destroy cycles with the process's resources counted.
 *
 *   hygiene one CYCLES                  one-rank communicators
 *   hygiene multi RANK NRANKS CYCLES DIR  NRANKS processes; rank 0 makes a
 *                                       fresh unique id every cycle and
 *                                       hands it over in DIR/id-<cycle>
 *
 * Every cycle joins a communicator, allreduces a few floats in a plain
 * buffer and in gocollMemAlloc memory, splits it (colour rank % 2) and
 * allreduces on the child, destroys the child and then the communicator.
 * After the warm-up (the first tenth of the cycles, at least 30 or half)
 * and after the last, once the counts
 * settled, it prints
 *
 *   USAGE <warm|end> cycle=<n> threads=<n> fds=<n> rss_kib=<n> shm=<n> memfds=<n> seconds=<s>
 *
 * threads: /proc/self/task entries (the Go runtime's threads, which it
 * keeps once started, and this one); fds: /proc/self/fd entries; shm:
 * entries of /dev/shm (the test gives the ranks a private one where it
 * can); memfds: descriptors and mappings of gocoll's memory files
 * ("/memfd:gocoll-...") in this process. The test compares the two lines. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "common.h"

struct usage {
  int threads, fds, shm, memfds;
  long rss_kib;
};

static int count_entries(const char* path) {
  DIR* d = opendir(path);
  struct dirent* e;
  int n = 0;
  if (d == NULL) FAIL("opendir %s: %s", path, strerror(errno));
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  }
  closedir(d);
  return n;
}

/* Descriptors and mappings of gocoll's memory files. */
static int count_memfds(void) {
  DIR* d = opendir("/proc/self/fd");
  struct dirent* e;
  char link[256], line[512];
  int n = 0;
  FILE* f;
  if (d == NULL) FAIL("opendir /proc/self/fd: %s", strerror(errno));
  while ((e = readdir(d)) != NULL) {
    ssize_t k;
    if (e->d_name[0] == '.') continue;
    k = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
    if (k > 0) {
      link[k] = 0;
      if (strncmp(link, "/memfd:gocoll-", 14) == 0) n++;
    }
  }
  closedir(d);
  f = fopen("/proc/self/maps", "r");
  if (f == NULL) FAIL("fopen /proc/self/maps: %s", strerror(errno));
  while (fgets(line, sizeof line, f) != NULL) {
    if (strstr(line, "/memfd:gocoll-") != NULL) n++;
  }
  fclose(f);
  return n;
}

static long rss_kib(void) {
  char line[256];
  long v = -1;
  FILE* f = fopen("/proc/self/status", "r");
  if (f == NULL) FAIL("fopen /proc/self/status: %s", strerror(errno));
  while (fgets(line, sizeof line, f) != NULL) {
    if (sscanf(line, "VmRSS: %ld kB", &v) == 1) break;
  }
  fclose(f);
  return v;
}

static void measure(struct usage* u) {
  u->threads = count_entries("/proc/self/task");
  u->fds = count_entries("/proc/self/fd");
  u->shm = count_entries("/dev/shm");
  u->memfds = count_memfds();
  u->rss_kib = rss_kib();
}

static int same(const struct usage* a, const struct usage* b) {
  return a->threads == b->threads && a->fds == b->fds && a->shm == b->shm && a->memfds == b->memfds;
}

/* settle measures until what a destroyed communicator's last goroutines
 * still hold is gone: the counts stop changing (three equal samples 10 ms
 * apart), no memory file is left and, with a baseline, descriptors and
 * /dev/shm entries are back at or below it; 10 s at most. (Threads are
 * not waited for: the Go runtime keeps idle threads for reuse.) */
static void settle(struct usage* u, const struct usage* base) {
  struct usage prev;
  int equal = 0;
  double deadline = now_seconds() + 10;
  measure(&prev);
  while (now_seconds() < deadline) {
    sleep_ms(10);
    measure(u);
    equal = same(u, &prev) ? equal + 1 : 0;
    prev = *u;
    if (equal >= 2 && u->memfds == 0 &&
        (base == NULL || (u->fds <= base->fds && u->shm <= base->shm)))
      return;
  }
}

static void print_usage(const char* when, int cycle, const struct usage* u, double seconds) {
  printf("USAGE %s cycle=%d threads=%d fds=%d rss_kib=%ld shm=%d memfds=%d seconds=%.3f\n", when, cycle,
         u->threads, u->fds, u->rss_kib, u->shm, u->memfds, seconds);
  fflush(stdout);
}

/* allreduce_check sums (rank in the job)+1 over comm's ranks in buf (16
 * floats): members_sum. */
static void allreduce_check(float* buf, gocollComm_t comm, int members_sum, const char* what) {
  int i;
  for (i = 0; i < 16; i++) buf[i] = (float)(g_rank + 1);
  CHECK_COMM(gocollAllReduce(buf, buf, 16, gocollFloat32, gocollSum, comm), comm);
  for (i = 0; i < 16; i++) {
    if (buf[i] != (float)members_sum) FAIL("%s: element %d is %g, want %d", what, i, buf[i], members_sum);
  }
}

static void use(gocollComm_t comm, int nranks) {
  float plain[16];
  void* mem = NULL;
  gocollComm_t sub = NULL;
  int r, sub_sum = 0;
  allreduce_check(plain, comm, nranks * (nranks + 1) / 2, "allreduce");
  CHECK_COMM(gocollMemAlloc(&mem, 4096, comm), comm);
  allreduce_check((float*)mem, comm, nranks * (nranks + 1) / 2, "allreduce in gocollMemAlloc memory");
  CHECK_COMM(gocollMemFree(mem, comm), comm);
  CHECK_COMM(gocollCommSplit(comm, g_rank % 2, g_rank, &sub), comm);
  for (r = g_rank % 2; r < nranks; r += 2) sub_sum += r + 1;
  allreduce_check(plain, sub, sub_sum, "allreduce on the split");
  CHECK_COMM(gocollCommDestroy(sub), sub);
}

/* unique_id returns cycle's id: made by rank 0 and written to
 * dir/id-<cycle> (renamed into place, so readers never see half of it). */
static gocollUniqueId unique_id(int cycle, const char* dir) {
  gocollUniqueId id;
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/id-%d", dir, cycle);
  if (g_rank == 0) {
    FILE* f;
    CHECK(gocollGetUniqueId(&id));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    f = fopen(tmp, "wb");
    if (f == NULL || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0) FAIL("write %s", tmp);
    if (rename(tmp, path) != 0) FAIL("rename %s: %s", tmp, strerror(errno));
  } else {
    double deadline = now_seconds() + 60;
    for (;;) {
      FILE* f = fopen(path, "rb");
      if (f != NULL) {
        size_t got = fread(&id, sizeof id, 1, f);
        fclose(f);
        if (got != 1) FAIL("short unique id in %s", path);
        break;
      }
      if (now_seconds() > deadline) FAIL("no unique id in %s after 60 s", path);
      sleep_ms(1);
    }
  }
  return id;
}

int main(int argc, char** argv) {
  int nranks = 1, cycles, warm, i;
  const char* dir = NULL;
  struct usage base, end;
  double start;
  if (argc == 3 && strcmp(argv[1], "one") == 0) {
    g_rank = 0;
    cycles = atoi(argv[2]);
  } else if (argc == 6 && strcmp(argv[1], "multi") == 0) {
    g_rank = atoi(argv[2]);
    nranks = atoi(argv[3]);
    cycles = atoi(argv[4]);
    dir = argv[5];
  } else {
    fprintf(stderr, "usage: hygiene one CYCLES | hygiene multi RANK NRANKS CYCLES DIR\n");
    return 2;
  }
  if (cycles < 2) FAIL("need at least 2 cycles");
  /* the first tenth, at least 30 cycles (half of short runs): the Go
   * heap needs a few dozen to reach its steady size */
  warm = cycles / 10;
  if (warm < 30) warm = cycles / 2 < 30 ? cycles / 2 : 30;
  start = now_seconds();
  for (i = 0; i < cycles; i++) {
    gocollComm_t comm = NULL;
    gocollUniqueId id;
    if (dir == NULL) {
      CHECK(gocollGetUniqueId(&id));
    } else {
      id = unique_id(i, dir);
    }
    CHECK(gocollCommInitRank(&comm, nranks, id, g_rank));
    if (dir != NULL && g_rank == 0) {
      /* every rank has joined, so has read it */
      char path[4096];
      snprintf(path, sizeof path, "%s/id-%d", dir, i);
      unlink(path);
    }
    use(comm, nranks);
    CHECK_COMM(gocollCommDestroy(comm), comm);
    if (i + 1 == warm) {
      settle(&base, NULL);
      print_usage("warm", i + 1, &base, now_seconds() - start);
    }
  }
  settle(&end, &base);
  print_usage("end", cycles, &end, now_seconds() - start);
  printf("OK rank %d of %d\n", g_rank, nranks);
  return 0;
}
