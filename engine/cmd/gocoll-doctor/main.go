// Command gocoll-doctor reads the flight-recorder dumps that the ranks of a
// job wrote (GOCOLL_DUMP_DIR: on a failure, on SIGUSR1, or when asked with
// gocollCommDumpState / comm.dump_state()) and says in one paragraph which
// rank did not arrive at which collective, which ranks were waiting for it,
// and what each rank did last.
//
//	gocoll-doctor [-json] DIR
//
// With -json it prints the verdicts (package flight's Verdict) instead.
// Exit status: 0 when it could judge (whatever it found), 2 when DIR holds
// no readable dump.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gocoll/gocoll/engine/flight"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gocoll-doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the verdicts as JSON")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gocoll-doctor [-json] DIR   (the GOCOLL_DUMP_DIR of the job)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	dumps, err := flight.ReadDir(fs.Arg(0))
	if err != nil {
		// Judge what could be read; say what could not.
		fmt.Fprintln(stderr, "gocoll-doctor:", err)
		if len(dumps) == 0 {
			return 2
		}
	}
	verdicts := flight.Diagnose(dumps)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(verdicts); err != nil {
			fmt.Fprintln(stderr, "gocoll-doctor:", err)
			return 2
		}
		return 0
	}
	for i, v := range verdicts {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintln(stdout, v.Text)
	}
	return 0
}
