# Moat's developer entry points. The README's two commands work without make.
.PHONY: build images test generate verify bench bench-agent-scale bench-tunnel demo

build:
	go build -o bin/ ./cmd/...
	ln -sf moat bin/kubectl-moat
	ln -sf moat bin/kubectl_complete-moat

# The three container images, without a registry (docs/install.md), tagged
# with deploy.Version as the manifests name them.
images:
	./hack/image/build.sh

test:
	./hack/test.sh

generate:
	./hack/update-codegen.sh

verify:
	./hack/verify-codegen.sh

# Benchmarks (figures and the exact command of each in BENCHMARKS.md), in
# three targets because the end-to-end ones run for hours: go test's default
# 10-minute timeout cannot hold them, and each needs its own -timeout.
# Those that need root or a real kube-apiserver skip loudly without them
# (make test builds the kube-apiserver and etcd: hack/kube/build.sh).
#
# bench: every benchmark of the libraries, the CLI, the lab and the kernel
# (policy, nft, matrix, decode, manifest, flowdiff, agent's caches, cmd/moat,
# lab, internal/...), at go test's default -benchtime; up to 60 minutes per
# package.
bench:
	go test -run '^$$' -bench . -benchmem -timeout 60m $$(go list ./... | grep -v -e '/agent/e2e$$' -e '/tunnel/e2e$$')

# bench-agent-scale: the real moat-agent against a real kube-apiserver
# loaded with 10,000, 30,000 and 100,000 pods, one size per go test run
# with BENCHMARKS.md's timeouts (90, 90 and 120 minutes at most).
bench-agent-scale:
	go test -run '^$$' -bench 'BenchmarkAgentScale/pods=10000$$' -benchtime 1x -timeout 90m ./agent/e2e
	go test -run '^$$' -bench 'BenchmarkAgentScale/pods=30000$$' -benchtime 1x -timeout 90m ./agent/e2e
	go test -run '^$$' -bench 'BenchmarkAgentScale/pods=100000$$' -benchtime 1x -timeout 120m ./agent/e2e

# bench-tunnel: the tunnel's end-to-end benchmarks (tunnel/e2e) at go
# test's default -benchtime, Moat alone (the comparisons with upstream need
# MOAT_TUNNEL_ANCHOR / MOAT_TUNNEL_ALT, see BENCHMARKS.md); SameRun and
# LinkUnderLoad alone are given 60 and 30 minutes there, so up to 120.
bench-tunnel:
	go test -run '^$$' -bench . -benchmem -timeout 120m ./tunnel/e2e
