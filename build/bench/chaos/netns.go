package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// hosts are emulated hosts as build/lib/netns.sh makes them: a network
// namespace each, a veth to a bridge in a namespace of its own, the link
// limited with tc tbf to rate in both directions ("unlimited": no tc).
// Rank r of np runs on host r·n/np. A slow-link fault changes one host's
// rate for a while.
type hosts struct {
	n, np int
	tag   string
	rate  string
	up    int
}

// of is rank's host, -1 for a job on loopback (h nil).
func (h *hosts) of(rank int) int {
	if h == nil {
		return -1
	}
	return rank * h.n / h.np
}

func (h *hosts) ns(i int) string { return fmt.Sprintf("gcc%d%s", i, h.tag) }
func (h *hosts) sw() string      { return "gccsw" + h.tag }
func (h *hosts) addr(i int) string {
	return fmt.Sprintf("198.18.0.%d", i+1)
}

// netnsUsable says why emulated hosts cannot be made here, or "".
func netnsUsable() string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces, tc, mounts)"
	}
	for _, t := range []string{"ip", "tc", "unshare", "mount"} {
		if _, err := exec.LookPath(t); err != nil {
			return "needs " + t
		}
	}
	return ""
}

func sh(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newHosts makes n hosts; down removes them.
func newHosts(n, np int, rate string) (*hosts, error) {
	h := &hosts{n: n, np: np, tag: fmt.Sprint(os.Getpid()), rate: rate}
	sw := h.sw()
	for _, c := range [][]string{{"ip", "netns", "add", sw}, {"ip", "-n", sw, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", sw, "link", "set", "br0", "up"}, {"ip", "-n", sw, "link", "set", "lo", "up"}} {
		if err := sh(c...); err != nil {
			h.down()
			return nil, err
		}
	}
	for i := range n {
		if err := h.add(i); err != nil {
			h.down()
			return nil, err
		}
	}
	return h, nil
}

func (h *hosts) add(i int) error {
	ns, sw := h.ns(i), h.sw()
	v, b := fmt.Sprintf("v%d%s", i, h.tag), fmt.Sprintf("b%d%s", i, h.tag)
	if err := sh("ip", "netns", "add", ns); err != nil {
		return err
	}
	h.up = i + 1
	for _, c := range [][]string{
		{"ip", "link", "add", v, "type", "veth", "peer", "name", b},
		{"ip", "link", "set", v, "netns", ns, "name", fmt.Sprintf("v%d", i)},
		{"ip", "link", "set", b, "netns", sw, "name", fmt.Sprintf("b%d", i)},
		{"ip", "-n", sw, "link", "set", fmt.Sprintf("b%d", i), "master", "br0"},
		{"ip", "-n", sw, "link", "set", fmt.Sprintf("b%d", i), "up"},
		{"ip", "-n", ns, "addr", "add", h.addr(i) + "/24", "dev", fmt.Sprintf("v%d", i)},
		{"ip", "-n", ns, "link", "set", fmt.Sprintf("v%d", i), "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
	} {
		if err := sh(c...); err != nil {
			return err
		}
	}
	return h.limit(i, "")
}

// limit sets host i's link (both directions) to rate; "" is the hosts'
// own rate.
func (h *hosts) limit(i int, rate string) error {
	if rate == "" {
		rate = h.rate
	}
	for _, side := range [][2]string{{h.ns(i), fmt.Sprintf("v%d", i)}, {h.sw(), fmt.Sprintf("b%d", i)}} {
		if rate == "unlimited" || rate == "0" {
			exec.Command("ip", "netns", "exec", side[0], "tc", "qdisc", "del", "dev", side[1], "root").Run()
			continue
		}
		if err := sh("ip", "netns", "exec", side[0], "tc", "qdisc", "replace", "dev", side[1], "root",
			"tbf", "rate", rate, "burst", "256kbit", "latency", "400ms"); err != nil {
			return err
		}
	}
	return nil
}

func (h *hosts) down() {
	if h == nil {
		return
	}
	for i := range h.up {
		exec.Command("ip", "netns", "del", h.ns(i)).Run()
	}
	exec.Command("ip", "netns", "del", h.sw()).Run()
	h.up = 0
}
