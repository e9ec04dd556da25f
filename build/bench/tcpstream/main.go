// Command tcpstream measures what a network path carries: one side listens
// and counts, the other streams for a while. build/hosts runs one pair per
// emulated host link at the same time, so the rate is what the links give
// with every host busy.
//
//	tcpstream -listen :5201 -seconds 4          prints "<bytes/s>" when the sender is done
//	tcpstream -connect 198.18.0.2:5201 -seconds 4
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

func main() {
	listen := flag.String("listen", "", "address to listen on (the receiving side)")
	connect := flag.String("connect", "", "address to stream to")
	seconds := flag.Float64("seconds", 4, "how long to stream")
	flag.Parse()
	var err error
	switch {
	case *listen != "":
		err = receive(*listen, *seconds)
	case *connect != "":
		err = send(*connect, *seconds)
	default:
		err = fmt.Errorf("give -listen or -connect")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcpstream:", err)
		os.Exit(1)
	}
}

// receive counts the bytes after the first second (TCP's slow start and
// tbf's burst are not the link's rate) until the sender closes.
func receive(addr string, seconds float64) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(time.Duration(seconds+30) * time.Second))
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	start := time.Now()
	var from time.Time
	var counted int64
	for {
		n, err := c.Read(buf)
		if time.Since(start) > time.Second {
			if from.IsZero() {
				from = time.Now()
			} else {
				counted += int64(n)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if from.IsZero() {
		return fmt.Errorf("the stream lasted less than a second")
	}
	fmt.Printf("%.0f\n", float64(counted)/time.Since(from).Seconds())
	return nil
}

func send(addr string, seconds float64) error {
	var c net.Conn
	var err error
	for i := 0; i < 100; i++ { // the receiver may not listen yet
		if c, err = net.Dial("tcp", addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(end) {
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
	return nil
}
