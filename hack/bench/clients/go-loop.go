// Kept-alive request loops through the front with Go's net/http Transport (what client-go runs):
// one goroutine per (path, cadence), each on its own Transport with one idle connection, for
// -seconds or until SIGTERM. A request the Transport retried on a new connection (it does so for
// an idempotent request whose reused connection closed before any byte of the answer) shows as a
// second GotConn in httptrace: counted as "retried", not failed. Prints one JSON object.
// Built by hack/bench/clients/run.sh with the standard library only.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type counts struct {
	Client   string         `json:"client"`
	Path     string         `json:"path"`
	Cadence  int            `json:"cadenceMs"`
	Ok       int            `json:"ok"`
	Retried  int            `json:"retried"`
	Failed   int            `json:"failed"`
	Failures map[string]int `json:"failures"`
}

func main() {
	front := flag.String("front", "", "host:port of the front")
	caFile := flag.String("ca", "", "CA file that verifies the front")
	paths := flag.String("paths", "/readyz", "comma-separated paths")
	cadences := flag.String("cadences", "0,1,5,20,100", "comma-separated pauses between requests, ms")
	seconds := flag.Int("seconds", 60, "how long to run at most")
	flag.Parse()
	token := os.Getenv("KCP_TOKEN")
	pem, err := os.ReadFile(*caFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	ctx, stop := context.WithTimeout(ctx, time.Duration(*seconds)*time.Second)
	defer stop()
	var all []*counts
	var wg sync.WaitGroup
	for _, path := range strings.Split(*paths, ",") {
		for _, c := range strings.Split(*cadences, ",") {
			cadence, _ := strconv.Atoi(c)
			k := &counts{Client: "go", Path: path, Cadence: cadence, Failures: map[string]int{}}
			all = append(all, k)
			wg.Add(1)
			go func() {
				defer wg.Done()
				loop(ctx, k, *front, token, pool)
			}()
		}
	}
	wg.Wait()
	json.NewEncoder(os.Stdout).Encode(all)
}

func loop(ctx context.Context, k *counts, front, token string, pool *x509.CertPool) {
	transport := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}},
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 1,
	}
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	for ctx.Err() == nil {
		conns := 0
		trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { conns++ }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
			"GET", "https://"+front+k.Path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		switch {
		case err != nil:
			k.Failed++
			k.Failures[err.Error()]++
		default:
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil {
				k.Failed++
				k.Failures["body: "+err.Error()]++
			} else if resp.StatusCode != 200 {
				k.Failed++
				k.Failures[fmt.Sprintf("HTTP %d", resp.StatusCode)]++
			} else if conns > 1 {
				k.Retried++
			} else {
				k.Ok++
			}
		}
		if k.Cadence > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(k.Cadence) * time.Millisecond):
			}
		}
	}
}
