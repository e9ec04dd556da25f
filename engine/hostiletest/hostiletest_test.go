package hostiletest

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
)

func TestParseProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1:8080",
		"00000000:0050":                         "0.0.0.0:80",
		"00000000000000000000000000000000:1F90": "[::]:8080",
		"0000000000000000FFFF00000100007F:0016": "127.0.0.1:22", // v4-mapped
	} {
		got, ok := parseProcAddr(in)
		if !ok || got.String() != want {
			t.Errorf("parseProcAddr(%q) = %v, %v; want %s", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007F:XYZ", "01007F:0050"} {
		if _, ok := parseProcAddr(bad); ok {
			t.Errorf("parseProcAddr(%q) accepted", bad)
		}
	}
}

// ListeningPorts finds this process's own listener, and only while it
// listens.
func TestListeningPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort(ln.Addr().String())
	ports, err := ListeningPorts(os.Getpid())
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	if !slices.Contains(ports, ap) {
		t.Errorf("listening on %v, found %v", ap, ports)
	}
	ln.Close()
	if ports, _ := ListeningPorts(os.Getpid()); slices.Contains(ports, ap) {
		t.Errorf("%v still found after Close: %v", ap, ports)
	}
}
