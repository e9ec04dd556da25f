package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestExampleOne(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"-src", "5:3", "-dst", "5:4", "-src-index", "2,1", "-dst-index", "3,4", "-n", "60", "-json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var got struct {
		COM   [][]int `json:"com"`
		Steps [][]struct {
			Src, Dst, Elems int
		} `json:"steps"`
		Method string `json:"method"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.COM) != 5 || got.COM[0][2] != 3 || got.Method != "algorithm-1" || len(got.Steps) != 5 {
		t.Fatalf("%s", out.String())
	}
	out.Reset()
	if code := run([]string{"-src", "6:2", "-dst", "6:3", "-src-index", "3,4", "-dst-index", "2,1", "-n", "36"}, &out, &errOut); code != 0 {
		t.Fatal(errOut.String())
	}
	if !strings.Contains(out.String(), "COM") || !strings.Contains(out.String(), "lower bound 6") {
		t.Fatalf("%s", out.String())
	}
	if code := run([]string{"-src", "6", "-dst", "6:3", "-n", "3"}, &out, &errOut); code == 0 {
		t.Fatal("a malformed -src was accepted")
	}
}
