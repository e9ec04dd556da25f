package tcp

import (
	"fmt"
	"net"
	"strings"
)

// Listen listens on host with a port chosen by the kernel. host may be ""
// (all interfaces), an IP address or a host name. The address to publish to
// other ranks is AdvertiseAddr(ln, host) when host is "" or a wildcard.
func Listen(host string) (net.Listener, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("tcp: listen on %q: %w", host, err)
	}
	return ln, nil
}

// AdvertiseAddr returns "host:port" for ln's port: with host set, that
// host; otherwise ln's own address when it is bound to a specific IP. It
// fails for a wildcard listener without host (choose one with
// InterfaceAddr or RouteAddr).
func AdvertiseAddr(ln net.Listener, host string) (string, error) {
	ta, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return "", fmt.Errorf("tcp: listener address %v is not TCP", ln.Addr())
	}
	if host != "" {
		return net.JoinHostPort(host, fmt.Sprint(ta.Port)), nil
	}
	if ta.IP == nil || ta.IP.IsUnspecified() {
		return "", fmt.Errorf("tcp: listener on %v has no single address to advertise; pass a host", ta)
	}
	return ta.String(), nil
}

// InterfaceAddr returns the first IPv4 address of the network interface
// named ifname (GOCOLL_SOCKET_IFNAME), else its first global IPv6 address,
// else its first IPv6 address with a zone. If no interface has exactly that
// name, the first interface whose name starts with ifname and has an
// address is used (so "eth" finds "eth0", as NCCL_SOCKET_IFNAME does). The
// error lists the interfaces that exist.
func InterfaceAddr(ifname string) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("tcp: listing network interfaces: %w", err)
	}
	var names []string
	for _, ifi := range ifs {
		names = append(names, ifi.Name)
	}
	pick := func(ifi net.Interface) string {
		addrs, err := ifi.Addrs()
		if err != nil {
			return ""
		}
		var v6, v6local string
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip := ipn.IP
			switch {
			case ip.To4() != nil:
				return ip.String()
			case ip.IsLinkLocalUnicast():
				if v6local == "" {
					v6local = ip.String() + "%" + ifi.Name
				}
			default:
				if v6 == "" {
					v6 = ip.String()
				}
			}
		}
		if v6 != "" {
			return v6
		}
		return v6local
	}
	for _, ifi := range ifs {
		if ifi.Name == ifname {
			if a := pick(ifi); a != "" {
				return a, nil
			}
			return "", fmt.Errorf("tcp: network interface %q (GOCOLL_SOCKET_IFNAME) has no IP address (flags %v)", ifname, ifi.Flags)
		}
	}
	if ifname != "" {
		for _, ifi := range ifs {
			if strings.HasPrefix(ifi.Name, ifname) {
				if a := pick(ifi); a != "" {
					return a, nil
				}
			}
		}
	}
	return "", fmt.Errorf("tcp: no network interface %q (GOCOLL_SOCKET_IFNAME); this host has: %s", ifname, strings.Join(names, ", "))
}

// RouteAddr returns the local IP address the kernel would use to reach
// remote ("host:port"), i.e. the address peers on that network can reach
// this host at. No packet is sent.
func RouteAddr(remote string) (string, error) {
	c, err := net.Dial("udp", remote)
	if err != nil {
		return "", fmt.Errorf("tcp: no route to %s: %w", remote, err)
	}
	defer c.Close()
	ua, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return "", fmt.Errorf("tcp: unexpected local address %v", c.LocalAddr())
	}
	if ua.Zone != "" {
		return ua.IP.String() + "%" + ua.Zone, nil
	}
	return ua.IP.String(), nil
}
