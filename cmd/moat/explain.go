package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

func newExplainCommand() *cobra.Command {
	var (
		in             inputFlags
		from, to, prot string
		port           int
		output         string
	)
	cmd := &cobra.Command{
		Use:   "explain [-f FILE... | --live] --from X --to Y --port N [--protocol TCP|UDP|SCTP]",
		Short: "Say whether one flow is allowed, and which rule decided each direction",
		Long: `explain judges a new connection from X to Y, where each is namespace/pod or
an IP address. It prints the verdict and, for egress (judged at the source pod)
and ingress (judged at the destination pod), the tier, policy, rule and action
that decided. Without -f and a live cluster, the embedded quickstart example
is read. Exit status: 0 when a verdict was computed (allowed or not), 1 for
bad input.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" || to == "" {
				return fmt.Errorf("--from and --to are required")
			}
			proto, err := policy.ParseProtocol(prot)
			if err != nil || !proto.HasPorts() {
				return fmt.Errorf("--protocol: must be TCP, UDP or SCTP, got %q", prot)
			}
			if !cmd.Flags().Changed("port") {
				return fmt.Errorf("--port is required (the destination port, 1-65535)")
			}
			if port < 1 || port > 65535 {
				return fmt.Errorf("--port: must be between 1 and 65535, got %d", port)
			}
			if output != "text" && output != "" && output != "json" {
				// Before reading what may be a large input.
				return fmt.Errorf("-o: must be text or json, got %q", output)
			}
			l, err := in.load(cmd)
			if err != nil {
				return err
			}
			// Only the flow's two pods are judged: compile for them alone.
			in.pods = endpointPods(&l.Cluster, from, to)
			prog, err := in.compileLoaded(cmd, l.Result)
			if err != nil {
				return err
			}
			src, err := prog.ParseEndpoint(from)
			if err != nil {
				return fmt.Errorf("--from: %w", err)
			}
			dst, err := prog.ParseEndpoint(to)
			if err != nil {
				return fmt.Errorf("--to: %w", err)
			}
			f := matrix.Judge(prog, matrix.Endpoint{Label: from, Endpoint: src}, matrix.Endpoint{Label: to, Endpoint: dst}, matrix.PortProto{Port: uint16(port), Protocol: proto})
			f.OtherFamilies = matrix.OtherFamilies(prog, matrix.Endpoint{Label: from, Endpoint: src}, matrix.Endpoint{Label: to, Endpoint: dst}, matrix.PortProto{Port: uint16(port), Protocol: proto})
			// A pod's connection to its own address is not policed, its
			// connection through a Service back to itself (hairpin) is:
			// say both.
			var hairpin *matrix.Flow
			if s, d, ok := prog.PairAddrs(src, dst); ok && src.Pod >= 0 && src.Pod == dst.Pod && s.Addr == d.Addr {
				v := prog.EvaluateHairpin(policy.Flow{Src: s, Dst: d, Proto: proto, Port: uint16(port)})
				hairpin = &matrix.Flow{From: from, To: to + " through a Service (hairpin)", Port: uint16(port), Protocol: proto.String(), Allowed: v.Allowed, Egress: v.Egress, Ingress: v.Ingress}
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(explainJSON{Flow: f, Egress: decisionJSON{f.Egress, f.Egress.Isolating}, Ingress: decisionJSON{f.Ingress, f.Ingress.Isolating}, Hairpin: hairpin})
			}
			writeExplanation(cmd.OutOrStdout(), f)
			for _, other := range f.OtherFamilies {
				fmt.Fprintln(cmd.OutOrStdout(), "also, over the other address family:")
				writeExplanation(cmd.OutOrStdout(), other)
			}
			if hairpin != nil {
				writeExplanation(cmd.OutOrStdout(), *hairpin)
			}
			return nil
		},
	}
	in.register(cmd)
	cmd.Flags().StringVar(&from, "from", "", "source: namespace/pod or IP address")
	cmd.Flags().StringVar(&to, "to", "", "destination: namespace/pod or IP address")
	cmd.Flags().IntVar(&port, "port", 0, "destination port")
	cmd.Flags().StringVar(&prot, "protocol", "TCP", "TCP, UDP or SCTP")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

// endpointPods lists the pods (namespace/name) that --from and --to name,
// directly or by one of their addresses.
func endpointPods(c *policy.Cluster, ends ...string) []string {
	var out []string
	for _, e := range ends {
		a, err := netip.ParseAddr(e)
		if err != nil {
			out = append(out, e)
			continue
		}
		for i := range c.Pods {
			if slices.Contains(c.Pods[i].IPs, a.Unmap()) {
				out = append(out, c.Pods[i].Key())
			}
		}
	}
	return out
}

func writeExplanation(w io.Writer, f matrix.Flow) {
	verdict := "DENIED"
	if f.Allowed {
		verdict = "ALLOWED"
	}
	fmt.Fprintf(w, "%s -> %s %d/%s: %s\n", f.From, f.To, f.Port, f.Protocol, verdict)
	for _, d := range []struct {
		name string
		dec  policy.Decision
	}{{"egress ", f.Egress}, {"ingress", f.Ingress}} {
		word := "allow"
		if !d.dec.Allowed {
			word = "deny "
		}
		fmt.Fprintf(w, "  %s %s [%s] %s\n", d.name, word, d.dec.Tier, d.dec.Reason)
		for _, p := range d.dec.Passed {
			fmt.Fprintf(w, "          passed by %s\n", p)
		}
	}
}

// explainJSON is explain's -o json: a matrix Flow, with every
// NetworkPolicy that isolates the pod when no rule allowed the flow
// (policy.Decision leaves them out of JSON, for matrices' sake).
type explainJSON struct {
	matrix.Flow
	Egress  decisionJSON `json:"egress"`
	Ingress decisionJSON `json:"ingress"`
	// Hairpin is the pod's connection through a Service back to itself,
	// when --from and --to are one pod's address.
	Hairpin *matrix.Flow `json:"hairpin,omitempty"`
}

type decisionJSON struct {
	policy.Decision
	Isolating []policy.PolicyRef `json:"isolating,omitempty"`
}
