//go:build tools

// Package tools pins go.etcd.io/etcd/etcdctl/v3 into this module's graph.
package tools

import _ "go.etcd.io/etcd/etcdctl/v3"
