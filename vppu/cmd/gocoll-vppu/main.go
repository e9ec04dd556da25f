// Command gocoll-vppu prints the routing tables of a virtual-device
// placement (docs/design/virtual-devices.md) without running a job: the virtual routing
// table of the logical topology, the physical routing table (which ranks
// and which link of the physical topology carry each virtual edge), and
// the links in use and left free.
//
//	gocoll-vppu -virtual ring:8 -physical builtin:hybrid-cube-mesh -map 0,1,2,3,4,5,6,7 -json
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gocoll/gocoll/topology"
	"github.com/gocoll/gocoll/vppu"
)

const help = `usage: gocoll-vppu -virtual TOPOLOGY -physical builtin:NAME|file:PATH -map PLACEMENT [-json]

  -virtual   ring:M, mesh:AxB, torus:AxB, tree:M or full:M (M virtual devices)
  -physical  a built-in of gocoll-topo (builtin:hybrid-cube-mesh, builtin:ring:4,
             builtin:cluster:2x2, …) or a topology file (file:PATH); its devices
             are the ranks
  -map       for each virtual device in order, the physical device it is placed
             on (repeats allowed), or block:N / cyclic:N

With -json: {"virtual": [[neighbour ids] per virtual device], "physical":
[{"from": v, "to": v, "ranks": [r, r], "link": string or null when local}],
"in_use": [link ids], "free": [link ids]}. A virtual edge between devices on
different ranks is carried by a direct link when there is one (of parallel
links, the least used), otherwise by the topology's route, its links joined
by ">".

flags:
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gocoll-vppu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, help); fs.PrintDefaults() }
	virtual := fs.String("virtual", "", "logical topology of the virtual devices")
	physical := fs.String("physical", "", "builtin:NAME or file:PATH")
	place := fs.String("map", "", "placement: ranks per virtual device, block:N or cyclic:N")
	asJSON := fs.Bool("json", false, "machine-readable output")
	bench := fs.Bool("bench", false, "measure migrations as one rank of a launched job (see build/vppubench)")
	devices := fs.Int("devices", 8, "with -bench: virtual devices")
	sizes := fs.String("sizes-mib", "0,1,8,32", "with -bench: MiB registered per device")
	rounds := fs.Int("rounds", 5, "with -bench: timed rounds")
	benchOp := fs.String("bench-op", "migrate", "with -bench: what to measure, migrate or allreduce (the virtual allreduce against the plain one)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *bench {
		f := runBench
		if *benchOp == "allreduce" {
			f = runAllReduceBench
		} else if *benchOp != "migrate" {
			fmt.Fprintf(stderr, "gocoll-vppu: -bench-op %q: want migrate or allreduce\n", *benchOp)
			return 2
		}
		if err := f(stdout, *devices, *sizes, *rounds); err != nil {
			fmt.Fprintln(stderr, "gocoll-vppu:", err)
			return 1
		}
		return 0
	}
	if err := show(stdout, *virtual, *physical, *place, *asJSON); err != nil {
		fmt.Fprintln(stderr, "gocoll-vppu:", err)
		return 1
	}
	return 0
}

func graph(spec string) (*topology.Graph, error) {
	kind, arg, ok := strings.Cut(spec, ":")
	switch {
	case ok && kind == "builtin":
		return topology.Builtin(arg)
	case ok && kind == "file":
		return topology.Load(arg)
	}
	return nil, fmt.Errorf("-physical %q: want builtin:NAME or file:PATH", spec)
}

func show(w io.Writer, virtual, physical, place string, asJSON bool) error {
	if virtual == "" || physical == "" || place == "" {
		return errors.New("-virtual, -physical and -map are required (see -h)")
	}
	m := 0
	if !strings.Contains(place, ":") {
		m = len(strings.Split(place, ","))
	}
	l, err := vppu.ParseLogical(virtual, m)
	if err != nil {
		return err
	}
	p, err := vppu.ParsePlace(place, l.M)
	if err != nil {
		return err
	}
	g, err := graph(physical)
	if err != nil {
		return err
	}
	t, err := vppu.RoutingTables(l, p, g)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(t)
	}
	fmt.Fprintf(w, "%s on %s, placement %v\n\nvirtual routing table\n", l, g.Name, p)
	for v, ns := range t.Virtual {
		fmt.Fprintf(w, "  v%d: %v\n", v, ns)
	}
	fmt.Fprintf(w, "\nphysical routing table\n")
	for _, e := range t.Physical {
		link := "local"
		if e.Link != nil {
			link = *e.Link
		}
		fmt.Fprintf(w, "  v%d -> v%d: rank %d -> rank %d over %s\n", e.From, e.To, e.Ranks[0], e.Ranks[1], link)
	}
	fmt.Fprintf(w, "\n%d links in use: %s\n%d free: %s\n", len(t.InUse), strings.Join(t.InUse, " "), len(t.Free), strings.Join(t.Free, " "))
	return nil
}
