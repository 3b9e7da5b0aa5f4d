package kubetest

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// SetPodIPs plays the kubelet's part for a pod: it writes status.podIP and
// status.podIPs (at most one address per family, primary first), marks the
// pod Running and Ready, and copies the host IP from the pod's Node when the
// pod is bound to one that has an InternalIP. It writes through the status
// subresource, as a kubelet does, retrying on conflicts.
func SetPodIPs(ctx context.Context, c kubernetes.Interface, namespace, name string, ips ...string) (*corev1.Pod, error) {
	key := namespace + "/" + name
	if len(ips) == 0 || len(ips) > 2 {
		return nil, fmt.Errorf("set IPs of pod %s: want 1 or 2 addresses, got %d", key, len(ips))
	}
	var podIPs []corev1.PodIP
	for i, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("set IPs of pod %s: invalid address %q", key, s)
		}
		if i == 1 && a.Is4() == netip.MustParseAddr(ips[0]).Is4() {
			return nil, fmt.Errorf("set IPs of pod %s: %s and %s are of the same family", key, ips[0], s)
		}
		podIPs = append(podIPs, corev1.PodIP{IP: a.String()})
	}

	var out *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.Spec.NodeName != "" {
			node, err := c.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("node %s: %w", pod.Spec.NodeName, err)
			}
			pod.Status.HostIP, pod.Status.HostIPs = nodeInternalIPs(node)
		}
		now := metav1.Now()
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP = podIPs[0].IP
		pod.Status.PodIPs = podIPs
		if pod.Status.StartTime == nil {
			pod.Status.StartTime = &now
		}
		setPodCondition(&pod.Status, corev1.PodReady, now)
		setPodCondition(&pod.Status, corev1.ContainersReady, now)
		out, err = c.CoreV1().Pods(namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("set IPs of pod %s: %w", key, err)
	}
	return out, nil
}

// nodeInternalIPs returns the node's first InternalIP of each family, as the
// API allows one host IP per family.
func nodeInternalIPs(node *corev1.Node) (string, []corev1.HostIP) {
	var ips []corev1.HostIP
	seen4, seen6 := false, false
	for _, a := range node.Status.Addresses {
		ip, err := netip.ParseAddr(a.Address)
		if a.Type != corev1.NodeInternalIP || err != nil {
			continue
		}
		if (ip.Is4() && seen4) || (!ip.Is4() && seen6) {
			continue
		}
		seen4, seen6 = seen4 || ip.Is4(), seen6 || !ip.Is4()
		ips = append(ips, corev1.HostIP{IP: ip.String()})
	}
	if len(ips) == 0 {
		return "", nil
	}
	return ips[0].IP, ips
}

func setPodCondition(st *corev1.PodStatus, t corev1.PodConditionType, now metav1.Time) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			if st.Conditions[i].Status != corev1.ConditionTrue {
				st.Conditions[i].Status = corev1.ConditionTrue
				st.Conditions[i].LastTransitionTime = now
			}
			return
		}
	}
	st.Conditions = append(st.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
}
