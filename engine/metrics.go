package engine

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus collectors a communicator updates. Create them
// once per registry with NewMetrics and share them between communicators
// (Options.Metrics); the library never touches the global registry.
type Metrics struct {
	ops     *prometheus.CounterVec
	bytes   *prometheus.CounterVec
	seconds *prometheus.HistogramVec
	errors  *prometheus.CounterVec
}

// NewMetrics registers gocoll's collectors with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gocoll_operations_total", Help: "Operations completed, by operation and algorithm.",
		}, []string{"op", "algo"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gocoll_operation_bytes_total", Help: "Bytes of the user buffer each operation covered (nccl-tests sizes).",
		}, []string{"op"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gocoll_operation_seconds", Help: "Time from the start of an operation's execution to its end.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 14),
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gocoll_operation_errors_total", Help: "Operations that failed, by operation and kind of failure.",
		}, []string{"op", "kind"}),
	}
	for _, c := range []prometheus.Collector{m.ops, m.bytes, m.seconds, m.errors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Metrics) observe(op, algo string, bytes int, took time.Duration, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.errors.WithLabelValues(op, errorKind(err)).Inc()
		return
	}
	m.ops.WithLabelValues(op, algo).Inc()
	m.bytes.WithLabelValues(op).Add(float64(bytes))
	m.seconds.WithLabelValues(op).Observe(took.Seconds())
}

func errorKind(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{{ErrTimeout, "timeout"}, {ErrMismatch, "mismatch"}, {ErrPeerLost, "peer_lost"}, {ErrRemoteAbort, "remote_abort"}, {ErrAborted, "aborted"}} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}
