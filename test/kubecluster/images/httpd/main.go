// Command httpd is the workload of the cluster tests: an HTTP server that answers every request
// with its pod's name and node, so a client sees which pod served it. With -dial it is also a
// client: every -every it opens a new TCP connection to the address, sends its pod's name and
// node on one line and closes it (the egress tests: the server sees each connection's source).
// Its image is built by `make cluster-images`.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

func main() {
	addr := flag.String("listen", ":8080", "address to listen on")
	dial := flag.String("dial", "", "host:port to open a new connection to every -every; empty: none")
	every := flag.Duration("every", 20*time.Millisecond, "interval between the connections of -dial (at least 1ms)")
	flag.Parse()
	pod, _ := os.Hostname()
	node := os.Getenv("NODE_NAME")
	if *dial != "" {
		go dialEvery(*dial, max(*every, time.Millisecond), pod+" "+node+"\n")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "%s %s\n", pod, node)
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// dialEvery opens a connection to addr every interval, for as long as the pod runs, and says
// line on it. Each connection is its own goroutine (at most 64 at once), so one that hangs
// (its packets lost) does not hold up the next. A failure is logged once per second at most.
func dialEvery(addr string, interval time.Duration, line string) {
	var mu sync.Mutex
	var lastLog time.Time
	var failed int
	slots := make(chan struct{}, 64)
	for t := time.NewTicker(interval); ; <-t.C {
		select {
		case slots <- struct{}{}:
		default:
			continue // 64 connections hang: skip this one
		}
		go func() {
			defer func() { <-slots }()
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				_, err = c.Write([]byte(line))
				_ = c.Close()
			}
			if err != nil {
				mu.Lock()
				defer mu.Unlock()
				failed++
				if time.Since(lastLog) > time.Second {
					fmt.Fprintf(os.Stderr, "%s dial %s: %v (%d failed)\n", time.Now().Format(time.RFC3339Nano), addr, err, failed)
					lastLog = time.Now()
				}
			}
		}()
	}
}
