package topology

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// The JSON form of a graph (see README.md in this folder):
//
//	{
//	  "name":  "two-boxes",                        optional
//	  "hosts": [{"name": "a", "cores": 2, "pus": 2, "numa_nodes": 1,
//	             "caches": [{"level": 2, "type": "unified", "size": 1048576, "count": 2}]}],
//	  "nodes": [{"id": 0, "kind": "device", "host": 0, "numa": 0, "name": "r0"},
//	            {"id": 9, "kind": "switch"}],
//	  "links": [{"id": "a.nic", "kind": "net", "a": 8, "b": 9,
//	             "bandwidth": 1.25e9, "latency": 2e-5}]
//	}
//
// kind of a node: device, switch or memory; "host" is an index into
// "hosts" (required for devices when hosts are given), "numa" optional.
// kind of a link: shm, net or dev; bandwidth in bytes/s each way, latency
// in seconds; several links may join the same two nodes.

type jsonGraph struct {
	Name  string     `json:"name,omitempty"`
	Hosts []jsonHost `json:"hosts,omitempty"`
	Nodes []jsonNode `json:"nodes"`
	Links []jsonLink `json:"links"`
}

type jsonHost struct {
	Name      string      `json:"name"`
	Cores     int         `json:"cores,omitempty"`
	PUs       int         `json:"pus,omitempty"`
	NUMANodes int         `json:"numa_nodes,omitempty"`
	Caches    []jsonCache `json:"caches,omitempty"`
}

type jsonCache struct {
	Level int    `json:"level"`
	Type  string `json:"type"`
	Size  int64  `json:"size"`
	Count int    `json:"count"`
}

type jsonNode struct {
	ID   int      `json:"id"`
	Kind NodeKind `json:"kind"`
	Name string   `json:"name,omitempty"`
	Host *int     `json:"host,omitempty"`
	NUMA *int     `json:"numa,omitempty"`
}

type jsonLink struct {
	ID        string   `json:"id"`
	Kind      LinkKind `json:"kind"`
	A         *int     `json:"a"`
	B         *int     `json:"b"`
	Bandwidth float64  `json:"bandwidth"`
	Latency   float64  `json:"latency"`
}

// MarshalJSON writes the graph in the documented schema.
func (g *Graph) MarshalJSON() ([]byte, error) {
	j := jsonGraph{Name: g.Name, Nodes: []jsonNode{}, Links: []jsonLink{}}
	for _, h := range g.Hosts {
		jh := jsonHost{Name: h.Name, Cores: h.Cores, PUs: h.PUs, NUMANodes: h.NUMANodes}
		for _, c := range h.Caches {
			jh.Caches = append(jh.Caches, jsonCache(c))
		}
		j.Hosts = append(j.Hosts, jh)
	}
	for _, n := range g.Nodes {
		jn := jsonNode{ID: n.ID, Kind: n.Kind, Name: n.Name}
		if n.Host >= 0 {
			jn.Host = &n.Host
		}
		if n.NUMA >= 0 {
			jn.NUMA = &n.NUMA
		}
		j.Nodes = append(j.Nodes, jn)
	}
	for _, l := range g.Links {
		j.Links = append(j.Links, jsonLink{ID: l.ID, Kind: l.Kind, A: &l.A, B: &l.B, Bandwidth: l.Bandwidth, Latency: l.Latency})
	}
	return json.Marshal(j)
}

// Parse reads a graph in the documented schema and validates it. Unknown
// fields are errors (a misspelt "bandwith" must not pass silently).
func Parse(data []byte) (*Graph, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var j jsonGraph
	if err := dec.Decode(&j); err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	g := &Graph{Name: j.Name, Source: "json"}
	for _, h := range j.Hosts {
		gh := Host{Name: h.Name, Cores: h.Cores, PUs: h.PUs, NUMANodes: h.NUMANodes}
		for _, c := range h.Caches {
			gh.Caches = append(gh.Caches, Cache(c))
		}
		g.Hosts = append(g.Hosts, gh)
	}
	for i, n := range j.Nodes {
		gn := Node{ID: n.ID, Kind: n.Kind, Name: n.Name, Host: -1, NUMA: -1}
		if n.Kind == "" {
			return nil, fmt.Errorf("topology: node %d (entry %d): no kind", n.ID, i)
		}
		if n.Host != nil {
			gn.Host = *n.Host
		}
		if n.NUMA != nil {
			gn.NUMA = *n.NUMA
		}
		g.Nodes = append(g.Nodes, gn)
	}
	for i, l := range j.Links {
		if l.A == nil || l.B == nil {
			return nil, fmt.Errorf("topology: link %q (entry %d): needs both ends \"a\" and \"b\"", l.ID, i)
		}
		g.Links = append(g.Links, Link{ID: l.ID, Kind: l.Kind, A: *l.A, B: *l.B, Bandwidth: l.Bandwidth, Latency: l.Latency})
	}
	if err := g.Validate(); err != nil {
		return nil, err
	}
	return g, nil
}

// Load reads and validates a graph from a JSON file.
func Load(path string) (*Graph, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	g, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	g.Source = "file:" + path
	return g, nil
}
