package main

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/gocoll/gocoll/topology"
)

// The example: a ring of 8 on the hybrid cube-mesh, one device per
// unit. Every virtual edge rides an existing link of the cube-mesh, and the
// links in use and the free ones together are all the links.
func TestJSONOnCubeMesh(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run([]string{"-virtual", "ring:8", "-physical", "builtin:hybrid-cube-mesh", "-map", "0,1,2,3,4,5,6,7", "-json"}, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	var got struct {
		Virtual  [][]int `json:"virtual"`
		Physical []struct {
			From, To int
			Ranks    [2]int
			Link     *string
		} `json:"physical"`
		InUse []string `json:"in_use"`
		Free  []string `json:"free"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	g, err := topology.Builtin("hybrid-cube-mesh")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Virtual[0], []int{1, 7}) || len(got.Physical) != 16 {
		t.Fatalf("virtual %v, %d physical edges", got.Virtual, len(got.Physical))
	}
	var ids []string
	for _, l := range g.Links {
		ids = append(ids, l.ID)
	}
	for _, e := range got.Physical {
		if e.Link == nil {
			t.Fatalf("edge %d→%d between two units has no link", e.From, e.To)
		}
		for _, id := range strings.Split(*e.Link, ">") {
			if !slices.Contains(ids, id) || !slices.Contains(got.InUse, id) {
				t.Fatalf("edge %d→%d over %q: not a link in use of the cube-mesh", e.From, e.To, *e.Link)
			}
		}
	}
	all := append(slices.Clone(got.InUse), got.Free...)
	slices.Sort(all)
	slices.Sort(ids)
	if !slices.Equal(all, ids) {
		t.Fatalf("in use ∪ free = %v, links %v", all, ids)
	}
}

func TestBadFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run([]string{"-virtual", "ring:8", "-physical", "builtin:ring:4", "-map", "0,1"}, &out, &errb); rc != 1 || !strings.Contains(errb.String(), "has 8 devices, not 2") {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
}
