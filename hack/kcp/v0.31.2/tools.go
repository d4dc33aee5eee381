//go:build tools

// Package tools pins github.com/kcp-dev/kcp/cmd/kcp and cmd/kcp-front-proxy into this module's graph.
package tools

import (
	_ "github.com/kcp-dev/kcp/cmd/kcp"
	_ "github.com/kcp-dev/kcp/cmd/kcp-front-proxy"
)
