package main

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/bootstrap"
)

// The library's own Prometheus registry, served only when
// GOCOLL_METRICS_ADDR is set. One per process: every communicator of the
// process reports into it.
var metricsState struct {
	once    sync.Once
	metrics *engine.Metrics
	err     error
}

// withMetrics attaches the process's metrics to opts, starting the HTTP
// endpoint on first use. Ranks sharing a host would all want the same port,
// so each adds its local rank to the port of GOCOLL_METRICS_ADDR.
func withMetrics(opts engine.Options, getenv func(string) string) (engine.Options, error) {
	addr := getenv("GOCOLL_METRICS_ADDR")
	if addr == "" {
		return opts, nil
	}
	metricsState.once.Do(func() {
		host, portStr, err := net.SplitHostPort(addr)
		port, perr := strconv.Atoi(portStr)
		if err != nil || perr != nil {
			metricsState.err = fmt.Errorf("%w: GOCOLL_METRICS_ADDR=%q: want host:port", engine.ErrInvalidArgument, addr)
			return
		}
		if l, err := bootstrap.FromEnv(getenv); err == nil && l.LocalRank > 0 {
			port += l.LocalRank
		}
		reg := prometheus.NewRegistry()
		m, err := engine.NewMetrics(reg)
		if err != nil {
			metricsState.err = err
			return
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			metricsState.err = fmt.Errorf("GOCOLL_METRICS_ADDR: %w", err)
			return
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		go http.Serve(ln, mux)
		metricsState.metrics = m
		if opts.Logger != nil {
			opts.Logger.Info("serving metrics", "addr", ln.Addr().String())
		}
	})
	opts.Metrics = metricsState.metrics
	return opts, metricsState.err
}
