/*
 * corelat [TRIPS]: how long a cache line takes to go from one core to another
 * and back, between two threads pinned to the first two CPUs this process
 * may use (TRIPS round trips, default 200000, the median of 3 runs, in ns on
 * stdout).
 *
 * build/compare runs it before and after every step: on the 2-vCPU VM the
 * two vCPUs sit on host cores that share a cache or do not (a round trip
 * several times longer), this changes while a run goes on, and a 2-rank
 * collective, a few such round trips when small, takes several times
 * longer in the second case (docs/performance.md).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Atomic long turn __attribute__((aligned(64)));
static int cpus[2];
static long trips = 200000;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *peer(void *arg) {
    (void)arg;
    pin(cpus[1]);
    for (long i = 0; i < 2 * trips; i += 2) {
        while (atomic_load_explicit(&turn, memory_order_acquire) != i + 1) {}
        atomic_store_explicit(&turn, i + 2, memory_order_release);
    }
    return NULL;
}

static double once(void) {
    pthread_t t;
    struct timespec a, b;
    atomic_store(&turn, 0);
    if (pthread_create(&t, NULL, peer, NULL) != 0) { perror("corelat: pthread_create"); exit(1); }
    pin(cpus[0]);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < 2 * trips; i += 2) {
        while (atomic_load_explicit(&turn, memory_order_acquire) != i) {}
        atomic_store_explicit(&turn, i + 1, memory_order_release);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / trips;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    cpu_set_t s;
    int n = 0;
    double r[3];
    if (argc > 1 && (trips = atol(argv[1])) < 1) { fprintf(stderr, "usage: corelat [TRIPS > 0]\n"); return 2; }
    if (sched_getaffinity(0, sizeof s, &s) != 0) { perror("corelat: sched_getaffinity"); return 1; }
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &s)) cpus[n++] = c;
    if (n < 2) { fprintf(stderr, "corelat: fewer than 2 CPUs allowed\n"); return 1; }
    for (int i = 0; i < 3; i++) r[i] = once();
    qsort(r, 3, sizeof r[0], cmp);
    printf("%.0f\n", r[1]);
    return 0;
}
