//go:build tools

// Package tools pins github.com/kcp-dev/kcp/cmd/kcp into this module's graph.
package tools

import _ "github.com/kcp-dev/kcp/cmd/kcp"
