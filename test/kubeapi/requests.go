package kubeapi

import (
	"bufio"
	"bytes"
	"context"
	"strconv"
	"strings"
)

// Request is one series of the API server's apiserver_request_total.
type Request struct {
	Verb     string // POST, PATCH, APPLY, GET, LIST, WATCH...
	Resource string // "services", or "services/status" with the subresource
	Count    float64
}

// Requests reads the API server's own count of the requests it served so far.
func (s *Server) Requests(ctx context.Context) ([]Request, error) {
	raw, err := s.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var out []Request
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "apiserver_request_total{") {
			continue
		}
		labels := l[strings.Index(l, "{")+1 : strings.LastIndex(l, "}")]
		get := func(k string) string {
			for kv := range strings.SplitSeq(labels, ",") {
				if name, v, ok := strings.Cut(kv, "="); ok && name == k {
					return strings.Trim(v, `"`)
				}
			}
			return ""
		}
		res := get("resource")
		if sub := get("subresource"); sub != "" {
			res += "/" + sub
		}
		v, _ := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
		out = append(out, Request{Verb: get("verb"), Resource: res, Count: v})
	}
	return out, sc.Err()
}
