package main

import (
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Line is one line a job printed (or the harness said), as it arrived.
type Line struct {
	T    time.Duration // since the job started
	Src  string        // "launcher", "rank 3", "new 0" (a replacement), "harness"
	Text string
}

// fields parses a line of slog's text handler (key=value, values quoted
// when they hold spaces) into its keys; nil if the line is none.
func fields(text string) map[string]string {
	i := strings.Index(text, "time=")
	if i < 0 || !strings.Contains(text, " msg=") {
		return nil
	}
	s := text[i:]
	out := map[string]string{}
	for len(s) > 0 {
		s = strings.TrimLeft(s, " ")
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			break
		}
		key := s[:eq]
		s = s[eq+1:]
		var val string
		if strings.HasPrefix(s, `"`) {
			end := closingQuote(s)
			v, err := strconv.Unquote(s[:end])
			if err != nil {
				v = s[1 : end-1]
			}
			val, s = v, s[end:]
		} else {
			sp := strings.IndexByte(s, ' ')
			if sp < 0 {
				sp = len(s)
			}
			val, s = s[:sp], s[sp:]
		}
		if _, dup := out[key]; !dup { // a key given twice (rank=) keeps its first value: the logger's own
			out[key] = val
		}
	}
	return out
}

// closingQuote is the index just past the quote that closes s's first one.
func closingQuote(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(s)
}

// ints parses slog's rendering of an []int: "[3]", "[3 5]" or "[]".
func ints(s string) []int {
	s = strings.Trim(s, "[]")
	var out []int
	for _, f := range strings.Fields(s) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// The lines the harness reads. The engine's (slog, GOCOLL_DEBUG=INFO)
// name their process by pid=; sgd's launcher names its children; the C
// client prints VIEW/DONE/CALL lines; the harness's own launcher says
// "chaos: rank r is pid P" like sgd's.
var (
	reStep       = regexp.MustCompile(`^step (\d+) loss `)
	reCall       = regexp.MustCompile(`^CALL (\d+)$`)
	reRankPid    = regexp.MustCompile(`^(?:sgd|chaos): rank (\d+) is pid (\d+)$`)
	reReplPid    = regexp.MustCompile(`^(?:sgd|chaos): replacement (\d+) for rank (\d+) is pid (\d+)$`)
	reDied       = regexp.MustCompile(`^sgd: rank (\d+) died(?: or was left out)? \(([^)]*)\)`)
	reReplFailed = regexp.MustCompile(`^sgd: replacement (\d+) failed \((.*)\); the job goes on`)
	reNPFailed   = regexp.MustCompile(`rank (\d+): (exit status \d+|signal: [a-z ]+)`)
	reExited     = regexp.MustCompile(`^chaos: (rank|new) (\d+) \(pid (\d+)\) exited: (.*)$`)
	reView       = regexp.MustCompile(`^(VIEW|DONE) gen=(\d+) size=(\d+) rank=(\d+) pids=([0-9,]+)$`)
	reHash       = regexp.MustCompile(`^weights sha256 ([0-9a-f]{64})$`)
	reLost       = regexp.MustCompile(`^step \d+: lost rank\(s\)`)
	reAdmitted   = regexp.MustCompile(`^step \d+: admitted \d+ joining`)
	// Phases of a recovery in the engine's log. "shrink" and "agreed" are
	// matched in the forms the engine may log them; a build that does not
	// log them never fires their triggers (the report says so).
	phaseMsgs = map[Phase]*regexp.Regexp{
		OnFailed:    regexp.MustCompile(`^communicator failed$`),
		OnShrink:    regexp.MustCompile(`^(shrink|shrinking|shrink: start.*|shrink started)$`),
		OnAgreed:    regexp.MustCompile(`^(agreed|shrink: agreed.*|agreement decided.*)$`),
		OnConnected: regexp.MustCompile(`^connected$`),
		OnShrunk:    regexp.MustCompile(`^shrunk$`),
	}
)

// splitPrefix takes sgd's "[rank r] " or "[new k] " off a line of its
// launcher: the process it came from, and the rest.
func splitPrefix(text string) (src, rest string) {
	if strings.HasPrefix(text, "[") {
		if end := strings.Index(text, "] "); end > 0 {
			return text[1:end], text[end+2:]
		}
	}
	return "", text
}

// parsedView is a C client's VIEW or DONE line.
type parsedView struct {
	done            bool
	gen, size, rank int
	pids            []int
}

func parseView(text string) (parsedView, bool) {
	m := reView.FindStringSubmatch(text)
	if m == nil {
		return parsedView{}, false
	}
	v := parsedView{done: m[1] == "DONE", gen: atoi(m[2]), size: atoi(m[3]), rank: atoi(m[4])}
	for _, p := range strings.Split(m[5], ",") {
		v.pids = append(v.pids, atoi(p))
	}
	return v, true
}
