/* Helpers shared by the C test programs of capi/ctest. Each program is run
 * by the Go tests in ../ (ranks started with exec, never fork). */
#ifndef GOCOLL_CTEST_COMMON_H_
#define GOCOLL_CTEST_COMMON_H_

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gocoll.h>

static int g_rank = -1;

/* CHECK aborts the program (exit 2) with the call, its code and the
 * library's last-error text when a call does not succeed. */
#define CHECK_COMM(call, comm)                                                              \
  do {                                                                                      \
    gocollResult_t rc_ = (call);                                                            \
    if (rc_ != gocollSuccess) {                                                             \
      fprintf(stderr, "rank %d: %s:%d: %s -> %d (%s): %s\n", g_rank, __FILE__, __LINE__,   \
              #call, (int)rc_, gocollGetErrorString(rc_), gocollGetLastError(comm));        \
      exit(2);                                                                              \
    }                                                                                       \
  } while (0)

#define CHECK(call) CHECK_COMM(call, NULL)

#define FAIL(...)                                                     \
  do {                                                                \
    fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__);  \
    fprintf(stderr, __VA_ARGS__);                                     \
    fprintf(stderr, "\n");                                            \
    exit(3);                                                          \
  } while (0)

static inline double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* 0 for the numbers that are no type (10 and 11, NCCL's float8). */
static inline size_t dtype_size(gocollDataType_t dt) {
  switch (dt) {
    case gocollInt8: case gocollUint8: case gocollBool: return 1;
    case gocollFloat16: case gocollBfloat16: case gocollInt16: return 2;
    case gocollInt32: case gocollUint32: case gocollFloat32: return 4;
    case gocollInt64: case gocollUint64: case gocollFloat64: return 8;
    default: return 0;
  }
}

static inline const char* dtype_name(gocollDataType_t dt) {
  static const char* names[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                                "float32", "float64", "bfloat16", "?", "?", "int16", "bool"};
  return (int)dt >= 0 && (int)dt < gocollNumTypes ? names[dt] : "?";
}

/* IEEE binary16 bits of v, which must be exactly representable as a normal
 * number or zero (the tests only use such values: small integers and
 * quarters). */
static inline uint16_t f16_bits(double v) {
  uint16_t sign = 0;
  int e;
  double m, f;
  if (signbit(v)) {
    sign = 0x8000;
    v = -v;
  }
  if (v == 0) return sign;
  m = frexp(v, &e); /* v = m * 2^e, m in [0.5, 1) */
  f = (m * 2 - 1) * 1024;
  if (f != floor(f) || e - 1 + 15 < 1 || e - 1 + 15 > 30) FAIL("%g is not an exact float16", v);
  return (uint16_t)(sign | ((e - 1 + 15) << 10) | (uint16_t)f);
}

/* bfloat16 bits of v, which must be exact (upper half of its float32). */
static inline uint16_t bf16_bits(double v) {
  float x = (float)v;
  uint32_t u;
  if ((double)x != v) FAIL("%g is not an exact float32", v);
  memcpy(&u, &x, 4);
  if (u & 0xffff) FAIL("%g is not an exact bfloat16", v);
  return (uint16_t)(u >> 16);
}

/* store writes v (exact in the type) as element i of a dt buffer. */
static inline void store(void* buf, size_t i, gocollDataType_t dt, double v) {
  char* p = (char*)buf + i * dtype_size(dt);
  switch (dt) {
    case gocollInt8: { int8_t x = (int8_t)v; memcpy(p, &x, 1); break; }
    case gocollUint8: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case gocollBool: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
    case gocollInt16: { int16_t x = (int16_t)v; memcpy(p, &x, 2); break; }
    case gocollInt32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case gocollUint32: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    case gocollInt64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case gocollUint64: { uint64_t x = (uint64_t)v; memcpy(p, &x, 8); break; }
    case gocollFloat16: { uint16_t x = f16_bits(v); memcpy(p, &x, 2); break; }
    case gocollFloat32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case gocollFloat64: { memcpy(p, &v, 8); break; }
    case gocollBfloat16: { uint16_t x = bf16_bits(v); memcpy(p, &x, 2); break; }
    default: FAIL("bad dtype %d", (int)dt);
  }
}

/* Compares n elements of got with want; reports the first difference. */
static inline void expect_equal(const char* what, const void* got, const void* want, size_t n,
                         gocollDataType_t dt) {
  size_t es = dtype_size(dt), i, k;
  for (i = 0; i < n; i++) {
    if (memcmp((const char*)got + i * es, (const char*)want + i * es, es) != 0) {
      fprintf(stderr, "rank %d: %s (%s): element %zu of %zu differs: got bytes", g_rank, what,
              dtype_name(dt), i, n);
      for (k = 0; k < es; k++) fprintf(stderr, " %02x", ((const unsigned char*)got)[i * es + k]);
      fprintf(stderr, ", want");
      for (k = 0; k < es; k++) fprintf(stderr, " %02x", ((const unsigned char*)want)[i * es + k]);
      fprintf(stderr, "\n");
      exit(4);
    }
  }
}

static inline void* xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) FAIL("out of memory");
  return p;
}

#endif
