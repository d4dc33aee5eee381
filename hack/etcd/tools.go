//go:build tools

// Package tools pins etcdctl, etcdutl and the etcd server into this module's graph.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/etcdutl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
