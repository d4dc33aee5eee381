//go:build tools

// Package tools pins kine into this module's graph.
package tools

import _ "github.com/k3s-io/kine"
