package policy

import (
	"fmt"
	"strings"
)

// GateIngressNetworksAndNodes is the name of the feature gate
// (features.IngressNetworksAndNodes) that admits the NPEP-127 ingress peers
// of ClusterNetworkPolicy; Options.IngressNetworksAndNodes carries its value.
const GateIngressNetworksAndNodes = "IngressNetworksAndNodes"

// unknownCNPFields is what the compiler treats as unknown in a
// ClusterNetworkPolicy: the fields decoding did not recognise plus the
// fields a disabled feature gate hides. A gated field is then enforced
// exactly like an unknown one (docs/semantics.md, fail closed), so turning
// a gate off can only take access away, and the CLI predicts what an agent
// with the same gates enforces.
func (s *state) unknownCNPFields(cnp *ClusterNetworkPolicy) []string {
	gated := GatedFields(cnp, s.opts)
	if len(gated) == 0 {
		return cnp.UnknownFields
	}
	return append(append([]string(nil), cnp.UnknownFields...), gated...)
}

// GatedFields lists the field paths of cnp that Moat understands but that
// a feature gate disabled in opts turns into unknown fields, in document
// order.
func GatedFields(cnp *ClusterNetworkPolicy, opts Options) []string {
	if opts.IngressNetworksAndNodes || cnp.ClusterNetworkPolicy == nil {
		return nil
	}
	var out []string
	for i := range cnp.Spec.Ingress {
		for j := range cnp.Spec.Ingress[i].From {
			p := &cnp.Spec.Ingress[i].From[j]
			if p.Networks != nil {
				out = append(out, fmt.Sprintf("spec.ingress[%d].from[%d].networks", i, j))
			}
			if p.Nodes != nil {
				out = append(out, fmt.Sprintf("spec.ingress[%d].from[%d].nodes", i, j))
			}
		}
	}
	return out
}

// unknownMessage is the diagnostic for a field treated as unknown: one a
// disabled gate hides says which gate; one outside spec fails the whole
// policy.
func (s *state) unknownMessage(path string) string {
	if objectProblem([]string{path}) != "" {
		return "unknown field outside spec: the whole policy is enforced fail-closed"
	}
	return s.unknownCause(path) + ": the part it belongs to is enforced fail-closed"
}

// unknownCause says why a field is treated as unknown, in the words every
// output uses (moat check, warnings, the explain note, the agent's
// condition): a field a disabled gate hides names the gate, so that an
// operator turns the gate on instead of hunting for a typo.
func (s *state) unknownCause(path string) string {
	if !s.opts.IngressNetworksAndNodes && isIngressNetworksOrNodes(path) {
		return "needs feature gate " + GateIngressNetworksAndNodes + " (off)"
	}
	if objectProblem([]string{path}) != "" {
		return "unknown field outside spec"
	}
	return "unknown field"
}

// isIngressNetworksOrNodes matches spec.ingress[i].from[j].networks and
// .nodes.
func isIngressNetworksOrNodes(path string) bool {
	rest, ok := strings.CutPrefix(path, "spec.ingress[")
	if !ok {
		return false
	}
	_, rest, ok = strings.Cut(rest, "].from[")
	if !ok {
		return false
	}
	_, field, ok := strings.Cut(rest, "].")
	return ok && (field == "networks" || field == "nodes")
}
