// Data-parallel logistic regression with gocoll, in C++.
//
// Every rank generates the same synthetic data set deterministically, keeps
// an equal shard of it, computes the mean gradient of the logistic loss on
// its shard, and averages the gradients over all ranks with
// gocollIAllReduce(..., gocollAvg) - overlapped with computing the shard's
// loss - before the same gradient-descent step on every rank. With equal
// shards the average of the shard means is the mean over the whole batch,
// so N ranks follow the same trajectory as one rank on the whole batch (up
// to rounding).
//
// Build (see Makefile):
//   build/build.sh                      # the library, into build/out
//   export PKG_CONFIG_PATH=build/out/lib/pkgconfig
//   c++ -O2 -o trainer examples/cpp/trainer.cpp $(pkg-config --cflags --libs gocoll)
// Run 4 ranks:
//   torchrun --nproc_per_node 4 --no_python --redirects 1 --tee 1 ./trainer
//   mpirun --allow-run-as-root --oversubscribe -np 4 ./trainer
// Options: trainer [steps [samples [features]]] (defaults 200 4096 16).
// Every rank prints "rank R weights w0 w1 ... bias" (%.17g) and rank 0 the
// loss every 50 steps.

#include <gocoll.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Error turns a failed gocoll call into an exception carrying its detail.
struct Error : std::runtime_error {
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

void check(gocollResult_t rc, gocollComm_t comm, const char* call) {
  if (rc != gocollSuccess) {
    throw Error(std::string(call) + ": " + gocollGetErrorString(rc) + ": " + gocollGetLastError(comm));
  }
}

// Communicator owns a gocoll communicator joined from the launcher's
// environment (torchrun, mpirun, srun, or GOCOLL_RANK/SIZE/ROOT_ADDR).
class Communicator {
 public:
  Communicator() {
    check(gocollCommInitFromEnv(&comm_), nullptr, "gocollCommInitFromEnv");
    check(gocollCommUserRank(comm_, &rank_), comm_, "gocollCommUserRank");
    check(gocollCommCount(comm_, &size_), comm_, "gocollCommCount");
  }
  ~Communicator() {
    if (comm_ != nullptr) gocollCommDestroy(comm_);
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Starts averaging v over all ranks in place; wait() completes it.
  gocollRequest_t start_average(std::vector<double>& v) {
    gocollRequest_t req = nullptr;
    check(gocollIAllReduce(v.data(), v.data(), v.size(), gocollFloat64, gocollAvg, comm_, &req), comm_,
          "gocollIAllReduce");
    return req;
  }
  void wait(gocollRequest_t req) { check(gocollWait(req), comm_, "gocollWait"); }

  double sum(double x) {
    check(gocollAllReduce(&x, &x, 1, gocollFloat64, gocollSum, comm_), comm_, "gocollAllReduce");
    return x;
  }

 private:
  gocollComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

// SplitMix64: a small deterministic generator, the same on every platform.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
};

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// Sample i of the data set: features in [-1, 1), and a label drawn from a
// logistic model with fixed true weights. Depends only on i, so any rank can
// make any shard.
void sample(int64_t i, int d, double* x, double* y) {
  Rng r{0x5EEDull * 1000003ull + (uint64_t)i};
  double z = 0.3;  // true bias
  for (int j = 0; j < d; j++) {
    x[j] = 2 * r.uniform() - 1;
    z += x[j] * (j % 2 == 0 ? 1.5 : -1.0) / (1 + j / 4);
  }
  *y = r.uniform() < sigmoid(z) ? 1.0 : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const int64_t samples = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int d = argc > 3 ? std::atoi(argv[3]) : 16;
  const double lr = 0.5;
  try {
    Communicator comm;
    if (samples % comm.size() != 0) {
      throw Error("the sample count must divide evenly among the ranks");
    }
    // This rank's shard.
    const int64_t n = samples / comm.size(), first = comm.rank() * n;
    std::vector<double> x(n * d), y(n);
    for (int64_t i = 0; i < n; i++) sample(first + i, d, &x[i * d], &y[i]);

    std::vector<double> w(d + 1, 0.0);  // weights, then bias
    std::vector<double> grad(d + 1);
    std::vector<double> p(n);
    for (int step = 0; step < steps; step++) {
      // Mean gradient of the logistic loss over the shard.
      std::fill(grad.begin(), grad.end(), 0.0);
      for (int64_t i = 0; i < n; i++) {
        double z = w[d];
        for (int j = 0; j < d; j++) z += w[j] * x[i * d + j];
        p[i] = sigmoid(z);
        double e = p[i] - y[i];
        for (int j = 0; j < d; j++) grad[j] += e * x[i * d + j];
        grad[d] += e;
      }
      for (double& g : grad) g /= (double)n;
      // Average the gradients over the ranks; meanwhile, now and then,
      // compute the shard's loss (the collectives that follow are issued in
      // the same order on every rank, as they must be).
      gocollRequest_t req = comm.start_average(grad);
      double loss = 0;
      if (step % 50 == 0) {
        for (int64_t i = 0; i < n; i++) loss -= y[i] * std::log(p[i]) + (1 - y[i]) * std::log(1 - p[i]);
      }
      comm.wait(req);
      if (step % 50 == 0) {
        double total = comm.sum(loss) / (double)samples;
        if (comm.rank() == 0) std::printf("step %d loss %.6f\n", step, total);
      }
      for (int j = 0; j <= d; j++) w[j] -= lr * grad[j];
    }
    std::printf("rank %d weights", comm.rank());
    for (double v : w) std::printf(" %.17g", v);
    std::printf("\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: %s\n", e.what());
    return 1;
  }
}
