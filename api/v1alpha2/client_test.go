package v1alpha2_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/moat-net/moat/api/client/clientset/versioned/fake"
	"github.com/moat-net/moat/api/client/informers/externalversions"
	moat "github.com/moat-net/moat/api/v1alpha2"
)

func samplePolicy() *moat.ClusterNetworkPolicy {
	return &moat.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "office-db"},
		Spec: moat.ClusterNetworkPolicySpec{
			Tier:     moat.AdminTier,
			Priority: 7,
			Subject:  moat.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
			Ingress: []moat.ClusterNetworkPolicyIngressRule{{
				Name:   "office",
				Action: moat.ClusterNetworkPolicyRuleActionAccept,
				From:   []moat.ClusterNetworkPolicyIngressPeer{{Networks: []moat.CIDR{"203.0.113.0/24"}}},
				Protocols: []moat.ClusterNetworkPolicyProtocol{{
					TCP: &moat.ClusterNetworkPolicyProtocolTCP{DestinationPort: &moat.Port{Range: &moat.PortRange{Start: 5432, End: 5433}}},
				}},
			}},
		},
	}
}

// TestGeneratedClientAndInformer drives the generated clientset, informer
// factory and lister end to end against the generated fake clientset:
// create, observe in the lister, update, observe the update.
func TestGeneratedClientAndInformer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	// NewClientset's field-managed tracker needs OpenAPI models that
	// applyconfiguration-gen only has with --openapi-schema, which CRD
	// types lack (kubernetes/kubernetes#126850); the simple tracker is the
	// supported fake for CRD clients.
	client := fake.NewSimpleClientset() //nolint:staticcheck // see above
	factory := externalversions.NewSharedInformerFactory(client, 0)
	defer func() {
		cancel() // stop the informers before Shutdown waits for them
		factory.Shutdown()
	}()
	informer := factory.Policy().V1alpha2().ClusterNetworkPolicies()
	lister := informer.Lister()
	_ = informer.Informer() // register before Start
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		t.Fatal("informer did not sync")
	}

	want := samplePolicy()
	if _, err := client.PolicyV1alpha2().ClusterNetworkPolicies().Create(ctx, want, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create: %v", err)
	}
	var got *moat.ClusterNetworkPolicy
	waitFor(ctx, t, "created policy in lister", func() bool {
		p, err := lister.Get("office-db")
		got = p
		return err == nil
	})
	if diff := cmp.Diff(want.Spec, got.Spec); diff != "" {
		t.Errorf("lister spec differs (-want +got):\n%s", diff)
	}

	upd := got.DeepCopy()
	upd.Spec.Priority = 8
	if _, err := client.PolicyV1alpha2().ClusterNetworkPolicies().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update: %v", err)
	}
	waitFor(ctx, t, "updated priority in lister", func() bool {
		p, err := lister.Get("office-db")
		return err == nil && p.Spec.Priority == 8
	})
	if got.Spec.Priority != 7 {
		t.Errorf("object returned earlier by the lister changed to priority %d: cache objects must not be mutated in place", got.Spec.Priority)
	}
}

// TestSchemeDecodesManifests: AddToScheme registers both kinds so a
// universal decoder turns a manifest into Moat's typed object.
func TestSchemeDecodesManifests(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := moat.AddToScheme(scheme); err != nil {
		t.Fatalf("AddToScheme: %v", err)
	}
	for _, kind := range []string{"ClusterNetworkPolicy", "ClusterNetworkPolicyList"} {
		if !scheme.Recognizes(moat.SchemeGroupVersion.WithKind(kind)) {
			t.Errorf("scheme does not recognise %s", kind)
		}
	}
	decoder := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
	obj, gvk, err := decoder.Decode([]byte(compatCases[len(compatCases)-1].manifest), nil, nil)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if gvk.Kind != "ClusterNetworkPolicy" || gvk.GroupVersion() != moat.SchemeGroupVersion {
		t.Errorf("decoded as %v", gvk)
	}
	p, ok := obj.(*moat.ClusterNetworkPolicy)
	if !ok {
		t.Fatalf("decoded into %T", obj)
	}
	if len(p.Spec.Ingress) != 4 || len(p.Spec.Ingress[0].From[0].Networks) != 2 || p.Spec.Ingress[1].From[0].Nodes == nil {
		t.Errorf("NPEP-127 peers lost in decoding: %+v", p.Spec.Ingress)
	}
	// Strict decoding names an unknown field, which the policy engine
	// turns into fail-closed behaviour.
	bad := []byte(`{"apiVersion":"policy.networking.k8s.io/v1alpha2","kind":"ClusterNetworkPolicy","metadata":{"name":"x"},` +
		`"spec":{"tier":"Admin","priority":1,"subject":{"namespaces":{}},"ingress":[{"action":"Deny","from":[{"services":{}}]}]}}`)
	if _, _, err := decoder.Decode(bad, nil, nil); err == nil {
		t.Errorf("strict decoder accepted unknown field spec.ingress[0].from[0].services")
	}
}

// TestDeepCopyIsDeep: the generated deepcopy shares no memory with the
// original, so the engine can keep copies of informer objects.
func TestDeepCopyIsDeep(t *testing.T) {
	orig := samplePolicy()
	cp := orig.DeepCopy()
	cp.Spec.Subject.Namespaces.MatchLabels["app"] = "web"
	cp.Spec.Ingress[0].From[0].Networks[0] = "0.0.0.0/0"
	cp.Spec.Ingress[0].Protocols[0].TCP.DestinationPort.Range.End = 9
	cp.Spec.Ingress[0].Name = "changed"
	if diff := cmp.Diff(samplePolicy(), orig); diff != "" {
		t.Errorf("mutating the copy changed the original (-want +got):\n%s", diff)
	}
	var obj runtime.Object = orig
	if c, ok := obj.DeepCopyObject().(*moat.ClusterNetworkPolicy); !ok || c == orig {
		t.Errorf("DeepCopyObject returned %T %p for %p", obj.DeepCopyObject(), c, orig)
	}
	list := &moat.ClusterNetworkPolicyList{Items: []moat.ClusterNetworkPolicy{*orig}}
	lc := list.DeepCopyObject().(*moat.ClusterNetworkPolicyList)
	lc.Items[0].Spec.Ingress[0].From[0].Networks[0] = "10.0.0.0/8"
	if list.Items[0].Spec.Ingress[0].From[0].Networks[0] != "203.0.113.0/24" {
		t.Errorf("list deep copy shares items")
	}
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
