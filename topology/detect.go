package topology

import (
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// DetectHost describes this machine: cores, hardware threads, NUMA nodes
// and caches. It asks hwloc (libhwloc.so.15, opened at run time, so gocoll
// neither links it nor needs it) and falls back to /sys when the library
// is missing or fails. Host.Name is the host name; the second result says
// which source answered ("hwloc" or "sys").
func DetectHost() (Host, string, error) {
	h, err := DetectHwloc()
	if err == nil {
		return h, "hwloc", nil
	}
	h, serr := DetectSys("/sys")
	if serr != nil {
		return Host{}, "", fmt.Errorf("topology: detection failed: hwloc: %v; /sys: %w", err, serr)
	}
	return h, "sys", nil
}

// Detect is this machine as a graph: one host, one device per core, the
// devices joined through the host's memory with DefaultParams' figures.
func Detect() (*Graph, error) {
	h, src, err := DetectHost()
	if err != nil {
		return nil, err
	}
	ranks := make([]int, max(h.Cores, 1))
	for i := range ranks {
		ranks[i] = i
	}
	g, err := ForPlacement([][]int{ranks}, DefaultParams())
	if err != nil {
		return nil, err
	}
	g.Hosts[0] = h
	g.Name, g.Source = h.Name, src
	return g, nil
}

func hostname() string {
	n, _ := os.Hostname()
	return n
}

// hwlocLibs are the names tried, newest ABI first.
var hwlocLibs = []string{"libhwloc.so.15", "libhwloc.so"}

// DetectHwloc asks hwloc for this machine's topology as XML (no C struct is
// read from Go: only functions with pointer and integer arguments are
// called) and summarises it.
func DetectHwloc() (Host, error) {
	var lib uintptr
	var err error
	for _, name := range hwlocLibs {
		if lib, err = purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL); err == nil {
			break
		}
	}
	if err != nil {
		return Host{}, fmt.Errorf("hwloc: %w", err)
	}
	// dlclose is left out on purpose: hwloc may keep its own state (and
	// threads on some builds) after the topology is destroyed.
	var (
		topoInit    func(*uintptr) int32
		topoLoad    func(uintptr) int32
		topoDestroy func(uintptr)
		exportXML   func(uintptr, **byte, *int32, uint64) int32
		freeXML     func(uintptr, *byte)
	)
	for _, f := range []struct {
		ptr  any
		name string
	}{{&topoInit, "hwloc_topology_init"}, {&topoLoad, "hwloc_topology_load"}, {&topoDestroy, "hwloc_topology_destroy"},
		{&exportXML, "hwloc_topology_export_xmlbuffer"}, {&freeXML, "hwloc_free_xmlbuffer"}} {
		sym, err := purego.Dlsym(lib, f.name)
		if err != nil {
			return Host{}, fmt.Errorf("hwloc: %w", err)
		}
		purego.RegisterFunc(f.ptr, sym)
	}
	var topo uintptr
	if rc := topoInit(&topo); rc != 0 {
		return Host{}, fmt.Errorf("hwloc_topology_init: %d", rc)
	}
	defer topoDestroy(topo)
	if rc := topoLoad(topo); rc != 0 {
		return Host{}, fmt.Errorf("hwloc_topology_load: %d", rc)
	}
	var buf *byte
	var n int32
	if rc := exportXML(topo, &buf, &n, 0); rc != 0 || buf == nil {
		return Host{}, fmt.Errorf("hwloc_topology_export_xmlbuffer: %d", rc)
	}
	data := strings.Clone(unsafe.String(buf, max(n-1, 0))) // n counts the final NUL
	freeXML(topo, buf)
	return ParseHwlocXML([]byte(data))
}

type hwlocObject struct {
	Type      string        `xml:"type,attr"`
	CacheSize int64         `xml:"cache_size,attr"`
	Depth     int           `xml:"depth,attr"`
	CacheType int           `xml:"cache_type,attr"` // 0 unified, 1 data, 2 instruction
	Children  []hwlocObject `xml:"object"`
}

// ParseHwlocXML summarises hwloc's XML export.
func ParseHwlocXML(data []byte) (Host, error) {
	var top struct {
		Objects []hwlocObject `xml:"object"`
	}
	if err := xml.Unmarshal(data, &top); err != nil {
		return Host{}, fmt.Errorf("hwloc XML: %w", err)
	}
	h := Host{Name: hostname()}
	caches := map[[2]string]*Cache{}
	var walk func(o hwlocObject)
	walk = func(o hwlocObject) {
		switch o.Type {
		case "Core":
			h.Cores++
		case "PU":
			h.PUs++
		case "NUMANode":
			h.NUMANodes++
		case "L1Cache", "L2Cache", "L3Cache", "L4Cache", "L1iCache", "L2iCache", "L3iCache":
			level := int(o.Type[1] - '0')
			typ := [...]string{"unified", "data", "instruction"}[min(max(o.CacheType, 0), 2)]
			if strings.Contains(o.Type, "iCache") {
				break // instruction caches: see DetectSys
			}
			key := [2]string{strconv.Itoa(level), typ}
			c := caches[key]
			if c == nil {
				c = &Cache{Level: level, Type: typ, Size: o.CacheSize}
				caches[key] = c
			}
			c.Count++
		}
		for _, ch := range o.Children {
			walk(ch)
		}
	}
	for _, o := range top.Objects {
		walk(o)
	}
	if h.PUs == 0 {
		return Host{}, errors.New("hwloc XML: no processing unit")
	}
	h.Caches = sortedCaches(caches)
	return h, nil
}

func sortedCaches(m map[[2]string]*Cache) []Cache {
	var out []Cache
	for _, c := range m {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Cache) int {
		if a.Level != b.Level {
			return a.Level - b.Level
		}
		return strings.Compare(a.Type, b.Type)
	})
	return out
}

// DetectSys reads the machine from a /sys tree (root is "/sys" except in
// tests): online CPUs, their cores, NUMA nodes, and caches (one instance
// per distinct set of CPUs sharing it).
func DetectSys(root string) (Host, error) {
	cpus, err := readList(filepath.Join(root, "devices/system/cpu/online"))
	if err != nil {
		return Host{}, err
	}
	h := Host{Name: hostname(), PUs: len(cpus)}
	cores := map[string]bool{}
	caches := map[[2]string]*Cache{}
	seen := map[string]bool{}
	for _, cpu := range cpus {
		dir := filepath.Join(root, fmt.Sprintf("devices/system/cpu/cpu%d", cpu))
		pkg, _ := os.ReadFile(filepath.Join(dir, "topology/physical_package_id"))
		core, err := os.ReadFile(filepath.Join(dir, "topology/core_id"))
		if err != nil {
			return Host{}, fmt.Errorf("/sys: %w", err)
		}
		cores[strings.TrimSpace(string(pkg))+"/"+strings.TrimSpace(string(core))] = true
		idx, _ := filepath.Glob(filepath.Join(dir, "cache/index*"))
		for _, d := range idx {
			read := func(name string) string {
				b, _ := os.ReadFile(filepath.Join(d, name))
				return strings.TrimSpace(string(b))
			}
			level, _ := strconv.Atoi(read("level"))
			typ := strings.ToLower(read("type"))
			size, err := parseSize(read("size"))
			// Instruction caches are left out, as hwloc does by default:
			// collectives move data.
			if level == 0 || err != nil || typ == "instruction" {
				continue
			}
			shared := read("shared_cpu_list")
			id := fmt.Sprintf("%d/%s/%s", level, typ, shared)
			if seen[id] {
				continue
			}
			seen[id] = true
			key := [2]string{strconv.Itoa(level), typ}
			c := caches[key]
			if c == nil {
				c = &Cache{Level: level, Type: typ, Size: size}
				caches[key] = c
			}
			c.Count++
		}
	}
	h.Cores = len(cores)
	nodes, _ := filepath.Glob(filepath.Join(root, "devices/system/node/node[0-9]*"))
	h.NUMANodes = max(len(nodes), 1)
	h.Caches = sortedCaches(caches)
	return h, nil
}

// readList parses a CPU list such as "0-3,8,10-11".
func readList(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("/sys: %w", err)
	}
	var out []int
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		z := a
		var err2 error
		if isRange {
			z, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || z < a {
			return nil, fmt.Errorf("/sys: %s: bad CPU list %q", path, b)
		}
		for c := a; c <= z; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}

// parseSize reads /sys cache sizes such as "32K" or "1024K".
func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v * mult, err
}
