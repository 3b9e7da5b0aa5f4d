package agent

import (
	"hash/maphash"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/moat-net/moat/policy"
)

// labelSets shares what many cached objects repeat. Pods of a workload
// carry the same labels and declare the same container ports, so a
// cluster has far fewer distinct label sets and port lists than pods; a
// map of a few labels costs some 400 bytes, a list of three ports 128.
// Shared, the pod cache costs about half. Policies' selectors share the
// same label maps, and their numeric ports one value per port number.
// Shared values are read-only (nothing in the agent or the policy
// compiler writes to a pod's labels or ports; the compiler copies them
// when it must).
type labelSets struct {
	labels *internTable[map[string]string]
	// podPorts are pods' declared ports.
	podPorts *internTable[[]policy.ContainerPort]

	// selectors are NetworkPolicies' peer selectors (selectors.go).
	selectors *internTable[peerSelector]

	mu sync.Mutex
	// ports holds one shared value per numeric port policies name
	// (selectors.go); at most one per port number. protocols and
	// policyTypes are the same for the valid protocols and policyTypes
	// lists.
	ports       map[int32]*intstr.IntOrString
	protocols   map[corev1.Protocol]*corev1.Protocol
	policyTypes [][]networkingv1.PolicyType
}

// labelSet is one interned labels map.
type labelSet = interned[map[string]string]

func newLabelSets() *labelSets {
	return &labelSets{
		labels:    newInternTable(hashLabels, maps.Equal[map[string]string]),
		podPorts:  newInternTable(hashPorts, slices.Equal[[]policy.ContainerPort]),
		selectors: newInternTable(hashSelector, equalSelector),
		ports:     map[int32]*intstr.IntOrString{},
		protocols: map[corev1.Protocol]*corev1.Protocol{},
	}
}

// intern returns the shared set equal to l, making l the shared one if
// there is none. It returns nil for no labels.
func (t *labelSets) intern(l map[string]string) *labelSet {
	if len(l) == 0 {
		return nil
	}
	return t.labels.intern(l)
}

// internPorts returns the shared list equal to ports; nil for none.
func (t *labelSets) internPorts(ports []policy.ContainerPort) *interned[[]policy.ContainerPort] {
	if len(ports) == 0 {
		return nil
	}
	return t.podPorts.intern(ports)
}

func (t *labelSets) len() int { return t.labels.len() }

// hashLabels is equal for equal maps: the sorted pairs, each key and
// value followed by a NUL (which label keys and values cannot contain).
func hashLabels(h *maphash.Hash, l map[string]string) {
	for _, k := range slices.Sorted(maps.Keys(l)) {
		h.WriteString(k)
		h.WriteByte(0)
		h.WriteString(l[k])
		h.WriteByte(0)
	}
}

// hashPorts is equal for equal lists.
func hashPorts(h *maphash.Hash, ports []policy.ContainerPort) {
	for _, p := range ports {
		h.WriteString(p.Name)
		h.WriteByte(0)
		h.WriteByte(byte(p.Protocol))
		h.WriteByte(byte(p.Port >> 8))
		h.WriteByte(byte(p.Port))
	}
}
