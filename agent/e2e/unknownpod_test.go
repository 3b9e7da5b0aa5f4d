package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/internal/kubetest"
)

// TestUnknownPodFailsClosedWithoutPodCIDRs: the lab's nodes have no
// spec.podCIDRs, and pod w runs on n2 (its veth and host route are in
// place) but is not in the API server when the agents start: as a pod
// whose address has not reached the agent yet. Before, it met no chain:
// its connections went through unpoliced both ways. Now n2 finds its host
// route, fails it closed (from it: spoofed; to it: unknown destination),
// and leaves the known pods alone; once the API server has w, w is
// policed as any pod (no policy here: allowed).
func TestUnknownPodFailsClosedWithoutPodCIDRs(t *testing.T) {
	requireHost(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	agentBinary(t)
	env := kubetest.Start(ctx, t, kubetest.WithCRDs(kubetest.CRDWithNewerFields(t)))
	c := newCluster(ctx, t, env, testNamespaces, testNodes, testPods)
	zero := int64(0)
	if err := env.Client.CoreV1().Pods("a").Delete(ctx, "w", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	c.startAgent("n1")
	c.startAgent("n2")
	c.waitReady("n1", "n2")
	c.expect(ctx, "w, unknown, fails closed; known pods unaffected", map[flow]bool{
		{w, z, 80}: false, {z, w, 80}: false, {w, x, 80}: false,
		{y, z, 80}: true, {z, y, 80}: true, {x, y, 80}: true,
	})

	fixture.CreatePod(ctx, t, env, fixture.Pod("a", "w", "n2", map[string]string{"app": "w"}, nil), c.podAddr(t, w))
	c.expect(ctx, "w known: allowed as any pod without policy", map[flow]bool{
		{w, z, 80}: true, {z, w, 80}: true, {w, x, 80}: true, {y, z, 80}: true,
	})
}
