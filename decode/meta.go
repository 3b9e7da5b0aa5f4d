package decode

import (
	"encoding/json"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// metaSchema lists the metadata Moat keeps; every other metadata field
// (annotations, managedFields, ownerReferences...) is skipped unread, so
// its size costs parsing only.
var metaSchema = schema{fields: []string{"name", "namespace", "uid", "resourceVersion", "generation", "labels"}}

// inventoryMetaSchema is what pods, nodes and namespaces need: of their
// annotations, kubectl's last-applied-configuration only.
var inventoryMetaSchema = schema{fields: []string{"name", "namespace", "labels", "annotations"}}

// lastAppliedKey is the annotation client-side kubectl apply keeps the
// applied manifest in: the labels it names are those a later apply of a
// manifest without them removes.
const lastAppliedKey = "kubectl.kubernetes.io/last-applied-configuration"

// meta reads metadata: of a policy (labels false) its identity and
// versions, which the agent reports status against; of other objects
// (labels true) name, namespace and labels. Problems in it are the
// object's identity being unknown: the caller drops the object.
func (d *dec) meta(m *metav1.ObjectMeta, labels bool) error {
	strict := d.strict
	d.strict = false // unknown and repeated metadata fields are the API server's business
	defer func() { d.strict = strict }()
	if labels {
		_, err := d.object(&inventoryMetaSchema, func(i int) error {
			switch i {
			case 0:
				return d.str(&m.Name)
			case 1:
				return d.str(&m.Namespace)
			case 2:
				return d.stringMap(&m.Labels)
			}
			return d.lastApplied(m)
		})
		return err
	}
	_, err := d.object(&metaSchema, func(i int) error {
		switch i {
		case 0:
			return d.str(&m.Name)
		case 1:
			return d.str(&m.Namespace)
		case 2:
			var uid string
			err := d.str(&uid)
			m.UID = types.UID(uid)
			return err
		case 3:
			return d.str(&m.ResourceVersion)
		case 4:
			return d.int64(&m.Generation)
		}
		return d.src.skip() // a policy's labels select nothing

	})
	return err
}

var (
	selectorSchema    = schema{fields: []string{"matchLabels", "matchExpressions"}}
	requirementSchema = schema{fields: []string{"key", "operator", "values"}}
)

// selector reads a metav1.LabelSelector; at names the schema location of
// its matchExpressions items for the CRD's required fields ("" when the
// API is not a CRD).
func (d *dec) selector(dst *metav1.LabelSelector, at string) error {
	req := &requirementSchema
	if at != "" {
		req = requiredSchema(&requirementSchema, at+".matchExpressions[]")
	}
	_, err := d.object(&selectorSchema, func(i int) error {
		if i == 0 {
			return d.stringMap(&dst.MatchLabels)
		}
		return list(d, &dst.MatchExpressions, func(r *metav1.LabelSelectorRequirement) error {
			_, err := d.object(req, func(i int) error {
				switch i {
				case 0:
					return d.str(&r.Key)
				case 1:
					var op string
					err := d.str(&op)
					r.Operator = metav1.LabelSelectorOperator(op)
					return err
				}
				return d.strList(&r.Values)
			})
			return err
		})
	})
	return err
}

// selectorPtr reads an optional selector: absent and null stay nil.
func (d *dec) selectorPtr(dst **metav1.LabelSelector, at string) error {
	k, err := d.src.peek()
	if err != nil || k == kNull {
		if err == nil {
			*dst = nil
			err = d.src.skip()
		}
		return err
	}
	if k != kObject {
		return d.wrong("an object", k)
	}
	s := &metav1.LabelSelector{}
	*dst = s
	return d.selector(s, at)
}

var conditionSchema = schema{fields: []string{"type", "status", "observedGeneration", "lastTransitionTime", "reason", "message"}}

// conditions reads status conditions (the agent compares them with the
// one it writes).
func (d *dec) conditions(dst *[]metav1.Condition) error {
	return list(d, dst, func(c *metav1.Condition) error {
		_, err := d.object(&conditionSchema, func(i int) error {
			switch i {
			case 0:
				return d.str(&c.Type)
			case 1:
				var s string
				err := d.str(&s)
				c.Status = metav1.ConditionStatus(s)
				return err
			case 2:
				return d.int64(&c.ObservedGeneration)
			case 3:
				var s string
				if err := d.str(&s); err != nil || s == "" {
					return err
				}
				t, err := time.Parse(time.RFC3339, s)
				if err != nil {
					d.badValue("invalid time " + s)
					return nil
				}
				c.LastTransitionTime = metav1.NewTime(t.Local()) // as metav1.Time.UnmarshalJSON
				return nil
			case 4:
				return d.str(&c.Reason)
			}
			return d.str(&c.Message)
		})
		return err
	})
}

// lastApplied reads, of annotations, kubectl's last-applied-configuration
// into m.Annotations and skips the rest unread. Annotations are not
// Moat's business: a value of the wrong type is skipped, not a problem.
func (d *dec) lastApplied(m *metav1.ObjectMeta) error {
	if k, err := d.src.peek(); err != nil || k != kObject {
		if err != nil {
			return err
		}
		return d.src.skip()
	}
	if err := d.src.enterObject(); err != nil {
		return err
	}
	for {
		key, ok, err := d.src.key()
		if err != nil || !ok {
			return err
		}
		k, err := d.src.peek()
		if err != nil {
			return err
		}
		if string(key) != lastAppliedKey || k != kString {
			if err := d.src.skip(); err != nil {
				return err
			}
			continue
		}
		v, err := d.src.str()
		if err != nil {
			return err
		}
		m.Annotations = map[string]string{lastAppliedKey: v}
	}
}

// lastAppliedLabels is the set of labels the last-applied-configuration
// in m names, nil when there is none (or it cannot be read).
func lastAppliedLabels(m *metav1.ObjectMeta) map[string]bool {
	v, ok := m.Annotations[lastAppliedKey]
	if !ok {
		return nil
	}
	var applied struct {
		Metadata struct {
			Labels map[string]json.RawMessage `json:"labels"`
		} `json:"metadata"`
	}
	if json.Unmarshal([]byte(v), &applied) != nil {
		return nil
	}
	out := make(map[string]bool, len(applied.Metadata.Labels))
	for k := range applied.Metadata.Labels {
		out[k] = true
	}
	return out
}
