// Package e2e holds end-to-end tests of the tunnel: the real
// konnectivity-client library and HTTP CONNECT clients on loopback, bulk and
// concurrency tests, failure tests, KEP-2025 in network namespaces, and
// benchmarks against direct loopback TCP. It has no non-test code.
package e2e
