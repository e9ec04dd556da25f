// Command gocoll-topo shows what gocoll knows about a machine: its
// topology (detected, built in or from a JSON file), the largest set of
// link-disjoint rings, and the cost model's predicted time of every
// algorithm of a collective at any rank count.
package main

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/sched"
	"github.com/gocoll/gocoll/topology"
	"github.com/gocoll/gocoll/topology/cost"
)

const help = `usage: gocoll-topo (-detect | -builtin NAME | -file F) [-rings | -predict OP ...] [-json]
       gocoll-topo -check measured.csv [-nic RATE] [-fit] [-json]
       gocoll-topo -tuned [-json]

  gocoll-topo -detect                          this machine (hwloc, else /sys)
  gocoll-topo -builtin hybrid-cube-mesh -rings the largest set of link-disjoint rings
  gocoll-topo -file my.json -json              a user's topology, validated, as JSON
  gocoll-topo -predict allreduce -builtin cluster -per-host 8 -ranks 8,64,512,4096 -bytes 64M

Built-ins: hybrid-cube-mesh, ring:N, torus:AxB, fattree:K, cluster:HxR[:BW]
(BW such as 250mbit or 10gbit). With -predict and -ranks, a built-in may be
named without its size (ring, torus, fattree, cluster) and is sized for each
rank count: ring:N; the squarest torus:AxB with A·B = N; the smallest
fattree:K with K³/4 ≥ N hosts (ranks on the first N); cluster:(N/R)xR with
R = -per-host and the NIC of -nic.

-tuned lists the allreduce tables that communicators across hosts timed and
cached (GOCOLL_TUNE, docs/tuning.md): placement, CPU, the algorithm chosen
per size and the time of each contender.

-check compares the cost model with measured times: rows of build/hosts'
raw.csv (or gocoll-bench -csv rows with "HxR,round," in front), whose label
names the forced algorithm (gocoll-ring, gocoll-hd, …); hosts of more than
one are joined by NICs of -nic. -fit then fits the model's figures.

Output shapes with -json:
  (no -rings, no -predict)  the graph: {"name", "hosts": [...], "nodes": [...],
                            "links": [...]} (schema: topology/README.md)
  -rings                    {"devices": [int], "links": [{"id": string, "a": int,
                            "b": int, "kind": string, "bandwidth": bytes/s,
                            "latency": s}], "rings": [[{"from": int, "to": int,
                            "link": string}]], "bound": int, "proved": bool,
                            "host_ring": [int]}; each ring's last hop returns to
                            its first device; "bound" is the independent upper
                            bound and "proved" says no larger set exists
  -check                    {"results": [{"op", "algo", "hosts", "per_host",
                            "bytes", "measured_s", "predicted_s", "error"}],
                            "median_abs_error", "p90_abs_error"}
  -predict OP               {"op": string, "bytes": int, "predictions": [{"ranks":
                            int, "topology": string, "algo": string, "seconds":
                            float, "busbw": GB/s, "best": bool, "busiest_link":
                            string}]}

flags:
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

type options struct {
	detect        bool
	builtin, file string
	rings, json   bool
	predict       string
	ranks         string
	bytes         string
	perHost       int
	nic           string
	check         string
	links         string
	fit           bool
	tuned         bool
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gocoll-topo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, help); fs.PrintDefaults() }
	var o options
	fs.BoolVar(&o.detect, "detect", false, "describe this machine")
	fs.StringVar(&o.builtin, "builtin", "", "a built-in topology")
	fs.StringVar(&o.file, "file", "", "a topology in JSON")
	fs.BoolVar(&o.rings, "rings", false, "print the largest set of link-disjoint rings")
	fs.BoolVar(&o.json, "json", false, "machine-readable output")
	fs.StringVar(&o.predict, "predict", "", "predict every algorithm of this collective ("+collNames()+")")
	fs.StringVar(&o.ranks, "ranks", "", "rank counts for -predict, comma-separated (default: the topology's devices)")
	fs.StringVar(&o.bytes, "bytes", "64M", "message size for -predict (K, M, G suffixes; nccl-tests size)")
	fs.IntVar(&o.perHost, "per-host", 8, "ranks per host when -predict sizes a cluster")
	fs.StringVar(&o.nic, "nic", "10gbit", "NIC bandwidth when -predict sizes a cluster, and of the hosts of -check's rows")
	fs.StringVar(&o.check, "check", "", "compare the model with measured rows (CSV: config,round,label,op,np,bytes,iters,med_us,…; label gocoll-ALGO; config HxR)")
	fs.BoolVar(&o.fit, "fit", false, "with -check: fit the model's figures to the rows and print them")
	fs.StringVar(&o.links, "links", "", "with -check: link rates measured with the rows (CSV: config,link,bytes_per_s, as build/hosts writes); a config's median replaces -nic")
	fs.BoolVar(&o.tuned, "tuned", false, "list the allreduce tables cached by GOCOLL_TUNE")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := o.run(stdout); err != nil {
		fmt.Fprintln(stderr, "gocoll-topo:", err)
		return 1
	}
	return 0
}

func collNames() string {
	var names []string
	for _, c := range sched.Colls() {
		if c != sched.AllToAllv && c != sched.AllToAllw { // their schedules depend on per-rank layouts
			names = append(names, c.String())
		}
	}
	return strings.Join(names, ", ")
}

func (o *options) sources() int {
	n := 0
	for _, b := range []bool{o.detect, o.builtin != "", o.file != ""} {
		if b {
			n++
		}
	}
	return n
}

func (o *options) run(w io.Writer) error {
	if o.check != "" {
		return o.runCheck(w)
	}
	if o.tuned {
		return o.runTuned(w)
	}
	if o.sources() != 1 {
		return errors.New("give exactly one of -detect, -builtin NAME, -file F (see -h)")
	}
	if o.predict != "" {
		return o.runPredict(w)
	}
	g, err := o.graph(o.builtin)
	if err != nil {
		return err
	}
	if o.rings {
		return printRings(w, g, o.json)
	}
	if o.json {
		return writeJSON(w, g)
	}
	fmt.Fprintln(w, g.Summary())
	fmt.Fprintf(w, "source: %s\n", g.Source)
	for i, h := range g.Hosts {
		if i == 8 && len(g.Hosts) > 9 {
			fmt.Fprintf(w, "… %d more hosts\n", len(g.Hosts)-8)
			break
		}
		fmt.Fprintf(w, "host %d %q: devices %v", i, h.Name, g.HostDevices()[i])
		if h.Cores > 0 {
			fmt.Fprintf(w, ", %d cores, %d hardware threads, %d NUMA nodes", h.Cores, h.PUs, h.NUMANodes)
		}
		for _, c := range h.Caches {
			fmt.Fprintf(w, ", L%d %s %s ×%d", c.Level, c.Type, size(c.Size), c.Count)
		}
		fmt.Fprintln(w)
	}
	return nil
}

func (o *options) graph(spec string) (*topology.Graph, error) {
	switch {
	case o.detect:
		return topology.Detect()
	case o.file != "":
		return topology.Load(o.file)
	}
	return topology.Builtin(spec)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

type jsonLink struct {
	ID        string  `json:"id"`
	A         int     `json:"a"`
	B         int     `json:"b"`
	Kind      string  `json:"kind"`
	Bandwidth float64 `json:"bandwidth"`
	Latency   float64 `json:"latency"`
}

type jsonHop struct {
	From int    `json:"from"`
	To   int    `json:"to"`
	Link string `json:"link"`
}

func printRings(w io.Writer, g *topology.Graph, asJSON bool) error {
	rs := g.MaxDisjointRings()
	if asJSON {
		out := struct {
			Devices  []int       `json:"devices"`
			Links    []jsonLink  `json:"links"`
			Rings    [][]jsonHop `json:"rings"`
			Bound    int         `json:"bound"`
			Proved   bool        `json:"proved"`
			HostRing []int       `json:"host_ring"`
		}{Devices: g.Devices(), Links: []jsonLink{}, Rings: [][]jsonHop{}, Bound: rs.Bound, Proved: rs.Proved, HostRing: g.HostRing()}
		for _, l := range g.Links {
			out.Links = append(out.Links, jsonLink{l.ID, l.A, l.B, string(l.Kind), l.Bandwidth, l.Latency})
		}
		for _, r := range rs.Rings {
			hops := []jsonHop{}
			for _, h := range r {
				hops = append(hops, jsonHop{h.From, h.To, g.Links[h.Link].ID})
			}
			out.Rings = append(out.Rings, hops)
		}
		return writeJSON(w, out)
	}
	fmt.Fprintln(w, g.Summary())
	proof := "the search proved no larger set exists"
	if !rs.Proved {
		proof = "not proved maximal (greedy search or search budget spent)"
	}
	fmt.Fprintf(w, "%d link-disjoint rings (upper bound %d; %s)\n", len(rs.Rings), rs.Bound, proof)
	for i, r := range rs.Rings {
		var parts []string
		for _, h := range r {
			parts = append(parts, fmt.Sprintf("%d -[%s]->", h.From, g.Links[h.Link].ID))
		}
		fmt.Fprintf(w, "ring %d: %s %d\n", i, strings.Join(parts, " "), r[0].From)
	}
	if len(rs.Rings) == 0 {
		fmt.Fprintf(w, "no ring over direct links; the ring order that keeps hosts together: %v\n", g.HostRing())
	}
	return nil
}

func size(b int64) string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%dB", b)
}

func parseBytes(s string) (int, error) {
	mult := 1
	l := strings.ToUpper(strings.TrimSpace(s))
	for suf, m := range map[string]int{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30} {
		if v, ok := strings.CutSuffix(l, suf); ok {
			l, mult = v, m
		}
	}
	v, err := strconv.Atoi(l)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want e.g. 4096, 64K, 64M", s)
	}
	return v * mult, nil
}

// sized instantiates a built-in family for n ranks.
func (o *options) sized(n int) (string, error) {
	fam := o.builtin
	switch fam {
	case "ring":
		return fmt.Sprintf("ring:%d", n), nil
	case "torus":
		a := int(math.Sqrt(float64(n)))
		for a > 1 && n%a != 0 {
			a--
		}
		return fmt.Sprintf("torus:%dx%d", a, n/a), nil
	case "fattree":
		k := 2
		for k*k*k/4 < n {
			k += 2
		}
		return fmt.Sprintf("fattree:%d", k), nil
	case "cluster":
		if n%o.perHost != 0 {
			return "", fmt.Errorf("%d ranks do not fill hosts of %d (-per-host)", n, o.perHost)
		}
		return fmt.Sprintf("cluster:%dx%d:%s", n/o.perHost, o.perHost, o.nic), nil
	}
	return fam, nil
}

type prediction struct {
	Ranks    int     `json:"ranks"`
	Topology string  `json:"topology"`
	Algo     string  `json:"algo"`
	Seconds  float64 `json:"seconds"`
	BusBW    float64 `json:"busbw"`
	Best     bool    `json:"best"`
	Busiest  string  `json:"busiest_link"`
}

func (o *options) runPredict(w io.Writer) error {
	coll, ok := sched.ParseColl(o.predict)
	if !ok || coll == sched.AllToAllv || coll == sched.AllToAllw {
		return fmt.Errorf("-predict %q: want one of %s", o.predict, collNames())
	}
	nbytes, err := parseBytes(o.bytes)
	if err != nil {
		return err
	}
	var counts []int
	if o.ranks != "" {
		for _, f := range strings.Split(o.ranks, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("-ranks %q: want positive integers", o.ranks)
			}
			counts = append(counts, n)
		}
	}
	if counts == nil {
		g, err := o.graph(o.builtin)
		if err != nil {
			return err
		}
		counts = []int{len(g.Devices())}
	}
	var all []prediction
	for _, n := range counts {
		spec := o.builtin
		if o.builtin != "" {
			if spec, err = o.sized(n); err != nil {
				return err
			}
		}
		g, err := o.graph(spec)
		if err != nil {
			return err
		}
		ps, err := Predict(g, coll, n, nbytes)
		if err != nil {
			return fmt.Errorf("%d ranks on %s: %w", n, g.Name, err)
		}
		all = append(all, ps...)
	}
	if o.json {
		return writeJSON(w, struct {
			Op          string       `json:"op"`
			Bytes       int          `json:"bytes"`
			Predictions []prediction `json:"predictions"`
		}{coll.String(), nbytes, all})
	}
	fmt.Fprintf(w, "%s of %s, predicted by the cost model\n", coll, size(int64(nbytes)))
	fmt.Fprintf(w, "%6s  %-28s %-14s %14s %10s  %s\n", "ranks", "topology", "algorithm", "time", "busbw GB/s", "busiest link")
	for _, p := range all {
		mark := ""
		if p.Best {
			mark = " *"
		}
		fmt.Fprintf(w, "%6d  %-28s %-14s %14s %10.3f  %s%s\n", p.Ranks, p.Topology, p.Algo, seconds(p.Seconds), p.BusBW, p.Busiest, mark)
	}
	fmt.Fprintln(w, "* fastest for that rank count")
	return nil
}

func seconds(s float64) string {
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%.1f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.2f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}

// Predict runs the cost model on every algorithm of coll that fits n ranks
// of g (the first n devices), for a vector of nbytes in float32.
func Predict(g *topology.Graph, coll sched.Coll, n, nbytes int) ([]prediction, error) {
	devs := g.Devices()
	if n > len(devs) {
		return nil, fmt.Errorf("%d ranks but %d devices", n, len(devs))
	}
	ranks := devs[:n]
	// Hosts of the ranks, for the hierarchical forms and host rings.
	var hosts [][]int
	byHost := map[int][]int{}
	var order []int
	for r, d := range ranks {
		nd, _ := g.Node(d)
		if _, ok := byHost[nd.Host]; !ok {
			order = append(order, nd.Host)
		}
		byHost[nd.Host] = append(byHost[nd.Host], r)
	}
	for _, h := range order {
		hosts = append(hosts, byHost[h])
	}
	even := true
	for _, h := range hosts {
		even = even && len(h) == len(hosts[0])
	}
	var ring []int
	for _, h := range hosts {
		ring = append(ring, h...)
	}
	rings := [][]int{ring}
	// Direct links: the disjoint rings, as rank orders.
	if n == len(devs) && n <= 64 {
		if rs := g.MaxDisjointRings(); len(rs.Rings) > 1 {
			pos := map[int]int{}
			for r, d := range ranks {
				pos[d] = r
			}
			rings = nil
			for _, r := range rs.Rings {
				var o []int
				for _, d := range r.Order() {
					o = append(o, pos[d])
				}
				rings = append(rings, o)
			}
		}
	}
	count := max(nbytes/4, 1)
	if coll == sched.AllGather || coll == sched.ReduceScatter || coll == sched.AllToAll {
		count = max(nbytes/4/n, 1)
	}
	// Algorithms are predicted side by side (a 4,096-rank ring is tens of
	// millions of operations).
	var entries []sched.Entry
	for _, e := range engine.Schedules() {
		if e.Coll == coll && !(e.Hosts && (len(hosts) < 2 || !even)) {
			entries = append(entries, e)
		}
	}
	out := make([]prediction, len(entries))
	errs := make([]error, len(entries))
	var wg sync.WaitGroup
	for i, e := range entries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := sched.Params{Coll: coll, N: n, ElemSize: 4, Count: count, Rings: rings, Hosts: hosts}
			s, err := e.Build(p)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", e.Name, err)
				return
			}
			m := cost.New(g)
			m.Ranks = ranks
			pr, err := m.Predict(s)
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", e.Name, err)
				return
			}
			name := e.Name
			if len(rings) > 1 && name == "ring" {
				name = fmt.Sprintf("ring×%d", len(rings))
			}
			out[i] = prediction{Ranks: n, Topology: g.Name, Algo: name, Seconds: pr.Seconds,
				BusBW: float64(nbytes) / pr.Seconds * busFactor(coll, n) / 1e9, Busiest: pr.Busiest}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	markBest(out)
	return out, nil
}

// markBest marks the fastest of out (the first of equals).
func markBest(out []prediction) {
	best := -1
	for i := range out {
		if best < 0 || out[i].Seconds < out[best].Seconds {
			best = i
		}
	}
	if best >= 0 {
		out[best].Best = true
	}
}

// busFactor is nccl-tests' bus bandwidth factor.
func busFactor(c sched.Coll, n int) float64 {
	switch c {
	case sched.AllReduce:
		return 2 * float64(n-1) / float64(n)
	case sched.AllGather, sched.ReduceScatter, sched.AllToAll:
		return float64(n-1) / float64(n)
	}
	return 1
}

// readLinks reads build/hosts' links.csv: the median measured rate per
// configuration.
func readLinks(path string) (map[string]float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	rates := map[string][]float64{}
	for _, r := range rows {
		if len(r) == 3 {
			if v, err := strconv.ParseFloat(r[2], 64); err == nil && v > 0 {
				rates[r[0]] = append(rates[r[0]], v)
			}
		}
	}
	out := map[string]float64{}
	for cfg, v := range rates {
		sort.Float64s(v)
		out[cfg] = v[len(v)/2]
	}
	return out, nil
}

// readSamples reads measured rows (build/hosts' raw.csv format); hosts of a
// configuration found in links are joined by NICs of its measured rate,
// the others by NICs of nic.
func readSamples(path string, nic float64, links map[string]float64) ([]cost.Sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// Medians over the rounds of each case.
	type key struct {
		coll           sched.Coll
		algo           string
		config         string
		h, r, bytesLen int
	}
	times := map[key][]float64{}
	var order []key
	for i, row := range rows {
		if len(row) < 8 || !strings.HasPrefix(row[2], "gocoll-") {
			continue
		}
		var h, r int
		if _, err := fmt.Sscanf(row[0], "%dx%d", &h, &r); err != nil {
			return nil, fmt.Errorf("%s line %d: config %q, want HxR", path, i+1, row[0])
		}
		coll, ok := sched.ParseColl(strings.ReplaceAll(row[3], "_", ""))
		if !ok {
			return nil, fmt.Errorf("%s line %d: op %q", path, i+1, row[3])
		}
		if coll == sched.AllToAllv || coll == sched.AllToAllw {
			continue // per-rank layouts: nothing the model can rebuild
		}
		b, err1 := strconv.Atoi(row[5])
		us, err2 := strconv.ParseFloat(row[7], 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s line %d: bytes %q, time %q", path, i+1, row[5], row[7])
		}
		k := key{coll, strings.TrimPrefix(row[2], "gocoll-"), row[0], h, r, b}
		if _, seen := times[k]; !seen {
			order = append(order, k)
		}
		times[k] = append(times[k], us/1e6)
	}
	var out []cost.Sample
	for _, k := range order {
		t := times[k]
		sort.Float64s(t)
		s := cost.Sample{Coll: k.coll, Algo: k.algo, Hosts: k.h, PerHost: k.r, Bytes: k.bytesLen, Measured: t[len(t)/2]}
		if k.h > 1 {
			s.NIC = nic
			if v, ok := links[k.config]; ok {
				s.NIC = v
			}
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no gocoll-ALGO rows", path)
	}
	return out, nil
}

func (o *options) runCheck(w io.Writer) error {
	nic, err := topology.ParseRate(o.nic)
	if err != nil {
		return err
	}
	var links map[string]float64
	if o.links != "" {
		if links, err = readLinks(o.links); err != nil {
			return err
		}
	}
	samples, err := readSamples(o.check, nic, links)
	if err != nil {
		return err
	}
	fig := cost.DefaultFigures()
	if o.fit {
		if fig, err = cost.Fit(samples, fig, engine.Schedules()); err != nil {
			return err
		}
	}
	rs, err := cost.Evaluate(samples, fig, engine.Schedules())
	if err != nil {
		return err
	}
	sum := cost.Summarize(rs)
	if o.json {
		type res struct {
			Op        string  `json:"op"`
			Algo      string  `json:"algo"`
			Hosts     int     `json:"hosts"`
			PerHost   int     `json:"per_host"`
			Bytes     int     `json:"bytes"`
			Measured  float64 `json:"measured_s"`
			Predicted float64 `json:"predicted_s"`
			Error     float64 `json:"error"`
		}
		var out []res
		for _, r := range rs {
			out = append(out, res{r.Coll.String(), r.Algo, r.Hosts, r.PerHost, r.Bytes, r.Measured, r.Predicted, r.Error()})
		}
		return writeJSON(w, struct {
			Results []res        `json:"results"`
			Median  float64      `json:"median_abs_error"`
			P90     float64      `json:"p90_abs_error"`
			Figures cost.Figures `json:"figures"`
		}{out, sum.Median, sum.P90, fig})
	}
	fmt.Fprintf(w, "| op | algorithm | hosts×ranks | size | measured | predicted | error |\n|---|---|---|---:|---:|---:|---:|\n")
	for _, r := range rs {
		fmt.Fprintf(w, "| %s | %s | %dx%d | %s | %s | %s | %+.0f%% |\n", r.Coll, r.Algo, r.Hosts, r.PerHost, size(int64(r.Bytes)), seconds(r.Measured), seconds(r.Predicted), r.Error()*100)
	}
	fmt.Fprintf(w, "\n%d cases: median |error| %.0f%%, 90th percentile %.0f%%, worst %.0f%%\n", sum.N, sum.Median*100, sum.P90*100, sum.Worst*100)
	if o.fit {
		fmt.Fprintf(w, "fitted figures: %+v\n", fig)
	}
	return nil
}

// runTuned prints the tables GOCOLL_TUNE cached on this machine.
func (o *options) runTuned(w io.Writer) error {
	names, tables, err := engine.CachedTuneTables()
	if err != nil {
		return err
	}
	if o.json {
		if tables == nil {
			tables = []engine.TuneTable{}
		}
		return json.NewEncoder(w).Encode(tables)
	}
	if len(tables) == 0 {
		dir, _ := engine.TuneCacheDir()
		fmt.Fprintf(w, "no table cached in %s\n", dir)
		return nil
	}
	for i, t := range tables {
		fmt.Fprintf(w, "%s\n  made %s on %q, hosts:ranks %s\n", names[i], t.Made, t.CPU, t.Placement)
		var sizes []int
		for s := range t.AllReduce {
			if n, err := strconv.Atoi(s); err == nil {
				sizes = append(sizes, n)
			}
		}
		sort.Ints(sizes)
		for _, n := range sizes {
			s := strconv.Itoa(n)
			var algos []string
			for a := range t.Times[s] {
				algos = append(algos, a)
			}
			sort.Strings(algos)
			var times []string
			for _, a := range algos {
				times = append(times, fmt.Sprintf("%s %.3f ms", a, t.Times[s][a]*1e3))
			}
			fmt.Fprintf(w, "  allreduce %6s: %-6s (%s)\n", size(int64(n)), t.AllReduce[s], strings.Join(times, ", "))
		}
	}
	return nil
}
