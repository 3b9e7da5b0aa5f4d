package app

import (
	"os"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"
)

// bridgeNetfilter names the bridges of the namespace the agent runs in
// (sysfs, as mounted for it) and the br_netfilter sysctls that are not 1
// (procfs: the calling thread's network namespace). With a bridge CNI
// (flannel's cni0, kubenet's cbr0, the bridge plugin) frames between pods
// of one node are bridged, not routed, and meet the forward hook, and so
// Moat's rules, only when br_netfilter passes them there: with the module
// missing or the sysctls at 0, pods on one node are not policed towards
// each other at all (docs/agent.md, "CNI requirements").
func bridgeNetfilter(sys, proc string) (bridges, off []string) {
	m, _ := filepath.Glob(filepath.Join(sys, "class/net/*/bridge"))
	for _, p := range m {
		bridges = append(bridges, filepath.Base(filepath.Dir(p)))
	}
	if len(bridges) == 0 {
		return nil, nil
	}
	for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		b, err := os.ReadFile(filepath.Join(proc, "sys/net/bridge", k))
		if err != nil || strings.TrimSpace(string(b)) != "1" {
			off = append(off, "net.bridge."+k)
		}
	}
	return bridges, off
}

// warnBridgeNetfilter logs once at start when a bridge is present and
// br_netfilter does not hand its frames to nftables.
func warnBridgeNetfilter(log klog.Logger) {
	bridges, off := bridgeNetfilter("/sys", "/proc")
	if len(off) > 0 {
		log.Info("Warning: bridges present but br_netfilter does not pass bridged IP traffic to nftables: pods behind one bridge are not policed towards each other (load br_netfilter and set the sysctls to 1)", "bridges", bridges, "sysctlsNot1", off)
	}
}
