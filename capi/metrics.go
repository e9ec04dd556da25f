package main

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/bootstrap"
	"github.com/gocoll/gocoll/engine/logthrottle"
)

// The library's own Prometheus registry, served only when
// GOCOLL_METRICS_ADDR is set. One per process: every communicator of the
// process reports into it.
var metricsState struct {
	once    sync.Once
	metrics *engine.Metrics
	addr    string // the address actually served ("" when none)
}

// metricsLimits bound what clients of the endpoint can hold: a scraper
// that never finishes a request, or many idle connections, must not grow a
// training process's descriptors and memory.
type metricsLimits struct {
	readHeader, read, write, idle time.Duration
	maxConns                      int
	portTries                     int           // ports tried from the configured one before an ephemeral port
	refusalWindow                 time.Duration // refusals logged in full per window (0: logthrottle's default)
}

var defaultMetricsLimits = metricsLimits{
	readHeader: 5 * time.Second,
	read:       10 * time.Second,
	write:      30 * time.Second,
	idle:       60 * time.Second,
	maxConns:   16,
	portTries:  64,
}

// withMetrics attaches the process's metrics to opts, starting the HTTP
// endpoint on first use. Ranks sharing a host would all want the same port,
// so each adds its local rank to the port of GOCOLL_METRICS_ADDR. Metrics
// never fail a communicator's creation: a bad address or a port in use is
// a WARN (and, for a port in use, another port is served and named).
func withMetrics(opts engine.Options, getenv func(string) string) (engine.Options, error) {
	addr := getenv("GOCOLL_METRICS_ADDR")
	if addr == "" {
		return opts, nil
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	metricsState.once.Do(func() {
		localRank := 0
		if l, err := bootstrap.FromEnv(getenv); err == nil && l.LocalRank > 0 {
			localRank = l.LocalRank
		}
		reg := prometheus.NewRegistry()
		m, err := engine.NewMetrics(reg)
		if err != nil {
			logger.Warn("metrics disabled: cannot create the registry", "err", err)
			return
		}
		served, err := serveMetrics(addr, localRank, reg, logger, defaultMetricsLimits)
		if err != nil {
			logger.Warn("metrics disabled", "GOCOLL_METRICS_ADDR", addr, "err", err)
			return
		}
		metricsState.metrics, metricsState.addr = m, served
	})
	opts.Metrics = metricsState.metrics
	return opts, nil
}

// serveMetrics serves reg at /metrics on addr's host and port+localRank,
// or, when that port is taken, on the next free one of lim.portTries, or
// else on an ephemeral port. It returns the address served.
func serveMetrics(addr string, localRank int, reg *prometheus.Registry, logger *slog.Logger, lim metricsLimits) (string, error) {
	host, portStr, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || port < 0 || port > 65535 {
		return "", errors.New("want host:port")
	}
	want := port + localRank
	var ln net.Listener
	for i := 0; i < lim.portTries && want+i <= 65535; i++ {
		ln, err = net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(want+i)))
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil && errors.Is(err, syscall.EADDRINUSE) {
		ln, err = net.Listen("tcp", net.JoinHostPort(host, "0"))
	}
	if err != nil {
		return "", err
	}
	served := ln.Addr().String()
	if ln.Addr().(*net.TCPAddr).Port != want && want != 0 {
		// Several ranks of a plain launch (no local rank) share a host and
		// the port: say where this one went, since scrapers must be told.
		logger.Warn("metrics: port in use, serving elsewhere", "wanted", net.JoinHostPort(host, strconv.Itoa(want)), "addr", served)
	} else {
		logger.Info("serving metrics", "addr", served)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: lim.readHeader,
		ReadTimeout:       lim.read,
		WriteTimeout:      lim.write,
		IdleTimeout:       lim.idle,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	go srv.Serve(&capListener{Listener: ln, sem: make(chan struct{}, lim.maxConns),
		refused: logthrottle.New(logger, "refused metrics connections", 0, lim.refusalWindow, nil)})
	return served, nil
}

// capListener holds at most cap(sem) connections open; one more is closed
// as soon as it is accepted, so a flood costs no descriptors or buffers.
// Each refusal is a WARN, throttled: a scraper refused for good is worth
// telling the operator, a flood is not worth a line per connection.
type capListener struct {
	net.Listener
	sem     chan struct{}
	refused *logthrottle.Limiter
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &capConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
			l.refused.Warn("metrics: refused connection, too many open", "remote", c.RemoteAddr().String(), "max", cap(l.sem))
			c.Close()
		}
	}
}

type capConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
