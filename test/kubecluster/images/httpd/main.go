// Command httpd is the workload of the cluster tests: an HTTP server that answers every request
// with its pod's name and node, so a client sees which pod served it. Its image is built by
// `make cluster-images`.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"
)

func main() {
	addr := flag.String("listen", ":8080", "address to listen on")
	flag.Parse()
	pod, _ := os.Hostname()
	node := os.Getenv("NODE_NAME")
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
