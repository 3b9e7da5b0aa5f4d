// Package images holds Moat's Dockerfile (one target per image:
// moat-agent, moat-proxy-server, moat-proxy-agent) and its test, which
// builds the images without a registry (hack/image/build.sh) and runs them:
// the agent container against a real API server, programming nftables in a
// network namespace, and the tunnel server and agent carrying a connection.
// It has no Go API.
package images
