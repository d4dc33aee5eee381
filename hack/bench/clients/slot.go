// A stand-in for a kcp slot, for hack/bench/clients/retire.sh: HTTPS (HTTP/1.1, TLS 1.3 from Go's
// crypto/tls, as kcp's), /readyz answers "ok", any other path a 14 KB JSON list. On SIGTERM it
// does what kcp does without a shutdown delay: /readyz answers 500 at once, and 100 ms later it
// stops listening and closes its idle connections (http.Server.Shutdown), finishing those in
// flight. Built from the standard library alone.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address")
	cert := flag.String("cert", "", "certificate file")
	key := flag.String("key", "", "key file")
	flag.Parse()
	var stopping atomic.Bool
	list := []byte(`{"kind":"WorkspaceList","items":[` + strings.Repeat(`{"metadata":{"name":"w"}},`, 560) + `{}]}`)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			if stopping.Load() {
				w.WriteHeader(500)
				w.Write([]byte("[-]shutdown failed: reason withheld\nreadyz check failed\n"))
				return
			}
			w.Write([]byte("ok"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(list)
	})
	srv := &http.Server{Addr: *listen, Handler: mux,
		TLSConfig:    &tls.Config{NextProtos: []string{"http/1.1"}},
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	go func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		<-ch
		stopping.Store(true)
		time.Sleep(100 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	if err := srv.ListenAndServeTLS(*cert, *key); err != nil && err != http.ErrServerClosed {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
}
