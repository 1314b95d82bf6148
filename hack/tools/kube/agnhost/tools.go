package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/interp"
	"mvdan.cc/sh/v3/syntax"
)

// shell is `sh [-x] -c COMMAND` (kubectl exec's form in the specs) or `sh` reading standard input.
func shell(args []string) int {
	fs := flag.NewFlagSet("sh", flag.ContinueOnError)
	trace := fs.Bool("x", false, "print each command before running it")
	command := fs.String("c", "", "the command to run")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	src := io.Reader(strings.NewReader(*command))
	if *command == "" {
		src = os.Stdin
	}
	file, err := syntax.NewParser().Parse(src, "sh")
	if err != nil {
		return fail("sh", 2, "%v", err)
	}
	params := []string{}
	if *trace {
		params = append(params, "-x")
	}
	runner, err := interp.New(interp.StdIO(os.Stdin, os.Stdout, os.Stderr), interp.Params(params...),
		interp.Env(expand.ListEnviron(os.Environ()...)))
	if err != nil {
		return fail("sh", 2, "%v", err)
	}
	err = runner.Run(context.Background(), file)
	var status interp.ExitStatus
	switch {
	case err == nil:
		return 0
	case errors.As(err, &status):
		return int(status)
	default:
		return fail("sh", 2, "%v", err)
	}
}

// netcat is `nc [-v] [-t|-u] [-w SECONDS] HOST PORT`: it sends standard input and prints what
// comes back until the peer closes or SECONDS pass without data (UDP: one datagram).
func netcat(args []string) int {
	fs := flag.NewFlagSet("nc", flag.ContinueOnError)
	verbose := fs.Bool("v", false, "say when connected")
	fs.Bool("t", false, "TCP (the default)")
	udp := fs.Bool("u", false, "UDP")
	wait := fs.Int("w", 5, "connect and idle timeout in seconds")
	if err := fs.Parse(args); err != nil || fs.NArg() != 2 {
		return fail("nc", 2, "usage: nc [-v] [-t|-u] [-w SECONDS] HOST PORT")
	}
	timeout := time.Duration(*wait) * time.Second
	network := "tcp"
	if *udp {
		network = "udp"
	}
	addr := net.JoinHostPort(fs.Arg(0), fs.Arg(1))
	conn, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return fail("nc", 1, "%v", err)
	}
	defer conn.Close()
	if *verbose {
		fmt.Fprintf(os.Stderr, "Connection to %s %s port [%s/*] succeeded!\n", fs.Arg(0), fs.Arg(1), network)
	}
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fail("nc", 1, "%v", err)
	}
	if _, err := conn.Write(in); err != nil {
		return fail("nc", 1, "%v", err)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.CloseWrite()
	}
	buf := make([]byte, 64<<10)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(timeout))
		n, err := conn.Read(buf)
		os.Stdout.Write(buf[:n])
		if err != nil || *udp {
			var ne net.Error
			if err != nil && !errors.Is(err, io.EOF) && !(errors.As(err, &ne) && ne.Timeout()) {
				return fail("nc", 1, "%v", err)
			}
			return 0
		}
	}
}

// curl is `curl [-q] [-s] [-g] [-i] [--connect-timeout S] [--max-time S] [-o FILE] [-w
// '%{http_code}'] URL` for GET over HTTP, exiting as curl does: 7 when it cannot connect (-w
// then prints the code 000), 28 on a timeout, 0 on any HTTP answer.
func curl(args []string) int {
	fs := flag.NewFlagSet("curl", flag.ContinueOnError)
	for _, b := range []string{"q", "s", "g"} {
		fs.Bool(b, false, "accepted, no effect")
	}
	include := fs.Bool("i", false, "print the status line and headers")
	connect := fs.Float64("connect-timeout", 0, "seconds to connect")
	maxTime := fs.Float64("max-time", 0, "seconds for the whole transfer")
	out := fs.String("o", "", "write the body to this file")
	format := fs.String("w", "", "what to print after the transfer: %{http_code}")
	if err := fs.Parse(curlArgs(args)); err != nil || fs.NArg() != 1 {
		return fail("curl", 2, "usage: curl [-q] [-s] [-g] [-i] [--connect-timeout S] [--max-time S] [-o FILE] [-w FORMAT] URL")
	}
	url := withScheme(fs.Arg(0))
	dialer := &net.Dialer{Timeout: seconds(*connect)}
	client := &http.Client{Timeout: seconds(*maxTime), Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		// As curl: -w still prints, with the status code 000.
		fmt.Print(strings.ReplaceAll(*format, "%{http_code}", "000"))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fail("curl", 28, "(28) %v", err)
		}
		return fail("curl", 7, "(7) %v", err)
	}
	defer resp.Body.Close()
	body := io.Writer(os.Stdout)
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return fail("curl", 23, "(23) %v", err)
		}
		defer f.Close()
		body = f
	}
	if *include {
		fmt.Fprintf(body, "%s %s\r\n", resp.Proto, resp.Status)
		_ = resp.Header.Write(body)
		fmt.Fprint(body, "\r\n")
	}
	if _, err := io.Copy(body, resp.Body); err != nil {
		return fail("curl", 56, "(56) %v", err)
	}
	fmt.Print(strings.ReplaceAll(*format, "%{http_code}", strconv.Itoa(resp.StatusCode)))
	return 0
}

// curlArgs turns curl's --long options into the flag package's form and leaves the rest.
func curlArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		if strings.HasPrefix(a, "--") {
			a = a[1:]
		}
		out = append(out, a)
	}
	return out
}

// wget is `wget [-q] [-T SECONDS] [-O -] URL` (also -qO-; the URL may lack http://), the body on standard output; exit 1
// on any failure or an HTTP error status, as busybox's.
func wget(args []string) int {
	var expanded []string
	for _, a := range args {
		if a == "-qO-" {
			expanded = append(expanded, "-q", "-O", "-")
			continue
		}
		expanded = append(expanded, a)
	}
	fs := flag.NewFlagSet("wget", flag.ContinueOnError)
	fs.Bool("q", false, "quiet")
	timeout := fs.Float64("T", 0, "network timeout in seconds")
	out := fs.String("O", "", "- for standard output (the only form supported)")
	if err := fs.Parse(expanded); err != nil || fs.NArg() != 1 || (*out != "" && *out != "-") {
		return fail("wget", 2, "usage: wget [-q] [-T SECONDS] [-O -] URL")
	}
	client := &http.Client{Timeout: seconds(*timeout), Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(withScheme(fs.Arg(0)))
	if err != nil {
		return fail("wget", 1, "%v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		return fail("wget", 1, "server returned error: %s", resp.Status)
	}
	if _, err := io.Copy(os.Stdout, resp.Body); err != nil {
		return fail("wget", 1, "%v", err)
	}
	return 0
}

// seq is `seq [FIRST] LAST`.
func seq(args []string) int {
	first, last := 1, 0
	var err error
	switch len(args) {
	case 1:
		last, err = strconv.Atoi(args[0])
	case 2:
		if first, err = strconv.Atoi(args[0]); err == nil {
			last, err = strconv.Atoi(args[1])
		}
	default:
		return fail("seq", 2, "usage: seq [FIRST] LAST")
	}
	if err != nil {
		return fail("seq", 2, "%v", err)
	}
	for i := first; i <= last; i++ {
		fmt.Println(i)
	}
	return 0
}

// withScheme is url, http:// when it names none (as curl and wget take it).
func withScheme(url string) string {
	if !strings.Contains(url, "://") {
		return "http://" + url
	}
	return url
}

// seconds is s seconds, 0 meaning no limit.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
