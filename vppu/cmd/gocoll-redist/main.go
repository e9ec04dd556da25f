// Command gocoll-redist prints the plan that redistributes a 1-D array
// between block-cyclic layouts (the CSS of docs/design/redistribution.md) without running it:
// the communication table COM and the schedule table CS.
//
//	gocoll-redist -src 5:3 -dst 5:4 -n 60                       cyclic(3) on 5 → cyclic(4) on 5
//	gocoll-redist -src 5:3 -dst 5:4 -src-index 2,1 -dst-index 3,4 -n 60   A(3i+4) = B(2i+1)
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/gocoll/gocoll/vppu/redist"
)

const help = `usage: gocoll-redist -src N:b -dst N:b [-src-index a2,b2] [-dst-index a1,b1] -n COUNT [-json]

The loop FORALL i in 0..n-1: A(a1·i+b1) = B(a2·i+b2), where B (the source)
is block-cyclic(b) over N processors (element g on processor ⌊g/b⌋ mod N)
and A (the destination) likewise. Prints COM (row i: source processor i,
column j: destination processor j, element counts) and CS (row i: source
processor i, column k: step k, the destination it sends to in that step),
how CS was made (algorithm-1, algorithm-2, or the colouring) and the lower
bound on the number of steps.

With -json: {"from": {...}, "q": int, "p": int, "com": [[int]], "steps":
[[{"src": int, "dst": int, "elems": int}]], "method": string,
"lower_bound": int}.

flags:
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gocoll-redist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, help); fs.PrintDefaults() }
	src := fs.String("src", "", "source array B: N:b (block-cyclic(b) over N processors)")
	dst := fs.String("dst", "", "destination array A: N:b")
	srcIdx := fs.String("src-index", "1,0", "a2,b2: the loop reads B(a2·i+b2)")
	dstIdx := fs.String("dst-index", "1,0", "a1,b1: the loop writes A(a1·i+b1)")
	n := fs.Int("n", -1, "loop count (i = 0..n-1)")
	asJSON := fs.Bool("json", false, "machine-readable output")
	bench := fs.Bool("bench", false, "run the benchmark as one rank of a launched job (see build/redistbench)")
	cases := fs.String("cases", "4:1>4:3,4:3>4:4,4:64>4:1,2:1>4:2,4:4096>2:1", "with -bench: layout pairs Q:y>P:x (source block-cyclic(y) on Q, destination block-cyclic(x) on P)")
	sizes := fs.String("sizes", "8M,64M", "with -bench: array sizes in bytes (float32)")
	rounds := fs.Int("rounds", 5, "with -bench: timed rounds")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *bench {
		cs, err := parseCases(*cases)
		var sz []int
		if err == nil {
			sz, err = parseSizes(*sizes)
		}
		if err == nil {
			err = runBench(stdout, cs, sz, *rounds)
		}
		if err != nil {
			fmt.Fprintln(stderr, "gocoll-redist:", err)
			return 1
		}
		return 0
	}
	a, err := parse(*src, *dst, *srcIdx, *dstIdx, *n)
	if err == nil {
		err = show(stdout, a, *asJSON)
	}
	if err != nil {
		fmt.Fprintln(stderr, "gocoll-redist:", err)
		return 1
	}
	return 0
}

func pair(flagName, s string) (int, int, error) {
	x, y, ok := strings.Cut(s, ",")
	if !ok {
		x, y, ok = strings.Cut(s, ":")
	}
	a, err1 := strconv.Atoi(strings.TrimSpace(x))
	b, err2 := strconv.Atoi(strings.TrimSpace(y))
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("-%s %q: want two integers", flagName, s)
	}
	return a, b, nil
}

func parse(src, dst, srcIdx, dstIdx string, n int) (redist.Affine, error) {
	var a redist.Affine
	var err error
	if src == "" || dst == "" || n < 0 {
		return a, errors.New("-src, -dst and -n are required (see -h)")
	}
	if a.Src.Procs, a.Src.Block, err = pair("src", src); err != nil {
		return a, err
	}
	if a.Dst.Procs, a.Dst.Block, err = pair("dst", dst); err != nil {
		return a, err
	}
	if a.SrcIndex.A, a.SrcIndex.B, err = pair("src-index", srcIdx); err != nil {
		return a, err
	}
	if a.DstIndex.A, a.DstIndex.B, err = pair("dst-index", dstIdx); err != nil {
		return a, err
	}
	a.N = n
	return a, nil
}

func show(w io.Writer, a redist.Affine, asJSON bool) error {
	p, err := redist.PlanAffine(a)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(p)
	}
	m, sh := a.Shift()
	fmt.Fprintf(w, "A(%d·i+%d) = B(%d·i+%d), i = 0..%d; B block-cyclic(%d) on %d processors (Q), A block-cyclic(%d) on %d (P)\n",
		a.DstIndex.A, a.DstIndex.B, a.SrcIndex.A, a.SrcIndex.B, a.N-1, a.Src.Block, a.Src.Procs, a.Dst.Block, a.Dst.Procs)
	fmt.Fprintf(w, "period %d iterations; Theorem 1: COM(i,j) = COM(i+k·%d mod %d, j+k·%d mod %d)\n\n", a.Period(), m, a.Src.Procs, sh, a.Dst.Procs)
	fmt.Fprintf(w, "COM  (row: source Q_i, column: destination P_j, elements)\n    ")
	for j := 0; j < p.P; j++ {
		fmt.Fprintf(w, "%5s", fmt.Sprintf("P%d", j))
	}
	fmt.Fprintln(w)
	for i, row := range p.COM {
		fmt.Fprintf(w, "Q%-3d", i)
		for _, c := range row {
			fmt.Fprintf(w, "%5d", c)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nCS  (row: source Q_i, column: step k, destination; %s, %d steps, lower bound %d)\n    ", p.Method, len(p.Steps), p.LowerBound)
	for k := range p.Steps {
		fmt.Fprintf(w, "%5d", k+1)
	}
	fmt.Fprintln(w)
	for i := 0; i < p.Q; i++ {
		fmt.Fprintf(w, "Q%-3d", i)
		for _, step := range p.Steps {
			cell := "-"
			for _, msg := range step {
				if msg.Src == i {
					cell = fmt.Sprintf("P%d", msg.Dst)
				}
			}
			fmt.Fprintf(w, "%5s", cell)
		}
		fmt.Fprintln(w)
	}
	return nil
}
