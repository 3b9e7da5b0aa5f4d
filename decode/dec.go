package decode

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// dec decodes one object at a time from a source, keeping the JSON path of
// the value being read so that every finding names its field.
type dec struct {
	src  source
	path []seg
	// ns places objects without a namespace; reset keeps it.
	ns namespacing
	// strict records unknown fields and duplicate fields (policies).
	// Inventory objects (pods, nodes, namespaces) are read leniently: only
	// the fields policy needs, the rest is skipped.
	strict bool

	// Findings about the object being decoded.
	unknown []string
	// problems are wrongly typed values and duplicate fields at their
	// exact paths; the kind decoders fold them into the part (unit) that
	// fails closed.
	problems []problem
	invalid  field.ErrorList
}

type seg struct {
	name string
	idx  int // -1 for a named member
}

type problem struct {
	path, msg string
	dup       bool
}

func (d *dec) reset(src source, strict bool) {
	d.src, d.strict = src, strict
	d.path = d.path[:0]
	d.unknown, d.problems, d.invalid = nil, nil, nil
}

func (d *dec) push(name string) { d.path = append(d.path, seg{name, -1}) }
func (d *dec) pushIdx(i int)    { d.path = append(d.path, seg{idx: i}) }
func (d *dec) pop()             { d.path = d.path[:len(d.path)-1] }

// pathString renders the current path as Kubernetes field paths do:
// spec.ingress[0].from[1].
func (d *dec) pathString() string {
	var b strings.Builder
	for i, s := range d.path {
		if s.idx >= 0 {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(s.idx))
			b.WriteByte(']')
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.name)
	}
	return b.String()
}

func (d *dec) child(name string) string {
	if p := d.pathString(); p != "" {
		return p + "." + name
	}
	return name
}

// wrong records a value of the wrong JSON type at the current path, as
// the field that is wrong, what it must be and what it is, and skips it.
func (d *dec) wrong(want string, got vkind) error {
	d.problems = append(d.problems, problem{path: d.pathString(), msg: fmt.Sprintf("must be %s, found %s", want, got)})
	return d.src.skip()
}

func (d *dec) badValue(msg string) {
	d.problems = append(d.problems, problem{path: d.pathString(), msg: msg})
}

// mark and since delimit the problems found while decoding one part.
func (d *dec) mark() int { return len(d.problems) }

func (d *dec) since(m int) []problem { return d.problems[m:] }

// report turns the problems found since m into invalid-field errors, each
// at the path of the value that is wrong: the compiler fails closed on
// the part that path belongs to, as it does for an unknown field there
// (docs/semantics.md).
func (d *dec) report(m int) {
	for _, p := range d.problems[m:] {
		d.invalid = append(d.invalid, p.fieldError(""))
	}
	d.problems = d.problems[:m]
}

// fieldError is the problem as an invalid-field error at its path, with
// what it does to the policy appended (effect, may be empty).
func (p problem) fieldError(effect string) *field.Error {
	typ, detail := field.ErrorTypeTypeInvalid, p.msg
	if p.dup {
		typ, detail = field.ErrorTypeDuplicate, "the field is given more than once"
	}
	if effect != "" {
		detail += "; " + effect
	}
	return &field.Error{Type: typ, Field: p.path, BadValue: field.OmitValueType{}, Detail: detail}
}

// schema is what a decoder knows of one JSON object type: its members,
// and which of them the CRD requires (bit i for fields[i]).
type schema struct {
	fields   []string
	required uint64
}

// member looks a key up in s.fields.
func (s *schema) member(key []byte) int {
	for i, f := range s.fields {
		if string(key) == f {
			return i
		}
	}
	return -1
}

// object reads an object of schema s, calling fn for each known member
// with the path already extended by its name. Unknown members are
// recorded (strict) and skipped; a member given twice is a problem (the
// last value is kept, as encoding/json does); missing required members are
// validation errors. null is an absent object. It returns whether an
// object was read.
func (d *dec) object(s *schema, fn func(i int) error) (bool, error) {
	k, err := d.src.peek()
	if err != nil {
		return false, err
	}
	switch k {
	case kNull:
		return false, d.src.skip()
	case kObject:
	default:
		return false, d.wrong("an object", k)
	}
	if err := d.src.enterObject(); err != nil {
		return false, err
	}
	var seen uint64
	for {
		key, ok, err := d.src.key()
		if err != nil {
			return false, err
		}
		if !ok {
			break
		}
		i := s.member(key)
		if i < 0 {
			if d.strict {
				d.unknown = append(d.unknown, d.child(string(key)))
			}
			if err := d.src.skip(); err != nil {
				return false, err
			}
			continue
		}
		d.push(s.fields[i])
		if seen&(1<<i) != 0 && d.strict {
			d.problems = append(d.problems, problem{path: d.pathString(), msg: "duplicate field", dup: true})
		}
		seen |= 1 << i
		err = fn(i)
		d.pop()
		if err != nil {
			return false, err
		}
	}
	if missing := s.required &^ seen; missing != 0 {
		for i, f := range s.fields {
			if missing&(1<<i) != 0 {
				d.invalid = append(d.invalid, field.Required(field.NewPath(d.child(f)), ""))
			}
		}
	}
	return true, nil
}

// str reads a string; null leaves dst as it is (encoding/json does the
// same).
func (d *dec) str(dst *string) error {
	k, err := d.src.peek()
	if err != nil {
		return err
	}
	switch k {
	case kString:
		*dst, err = d.src.str()
		return err
	case kNull:
		return d.src.skip()
	}
	return d.wrong("a string", k)
}

func (d *dec) integer(lo, hi int64) (int64, bool, error) {
	k, err := d.src.peek()
	if err != nil {
		return 0, false, err
	}
	switch k {
	case kNumber:
		v, ok, text, err := d.src.integer()
		if err != nil {
			return 0, false, err
		}
		if !ok || v < lo || v > hi {
			if ok {
				text = strconv.FormatInt(v, 10)
			}
			if ok {
				d.badValue(fmt.Sprintf("must be an integer between %d and %d, found %s", lo, hi, text))
			} else {
				d.badValue("must be an integer, found " + text)
			}
			return 0, false, nil
		}
		return v, true, nil
	case kNull:
		return 0, false, d.src.skip()
	}
	return 0, false, d.wrong("an integer", k)
}

func (d *dec) int32(dst *int32) error {
	v, ok, err := d.integer(math.MinInt32, math.MaxInt32)
	if ok {
		*dst = int32(v)
	}
	return err
}

func (d *dec) int64(dst *int64) error {
	v, ok, err := d.integer(math.MinInt64, math.MaxInt64)
	if ok {
		*dst = v
	}
	return err
}

func (d *dec) bool(dst *bool) error {
	k, err := d.src.peek()
	if err != nil {
		return err
	}
	switch k {
	case kBool:
		*dst, err = d.src.boolean()
		return err
	case kNull:
		return d.src.skip()
	}
	return d.wrong("a boolean", k)
}

// stringMap reads a map of strings (labels, matchLabels). Keys given twice
// are problems when strict.
func (d *dec) stringMap(dst *map[string]string) error {
	k, err := d.src.peek()
	if err != nil {
		return err
	}
	switch k {
	case kNull:
		return d.src.skip()
	case kObject:
	default:
		return d.wrong("a map of strings", k)
	}
	if err := d.src.enterObject(); err != nil {
		return err
	}
	m := *dst
	if m == nil {
		m = map[string]string{}
	}
	for {
		key, ok, err := d.src.key()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		name := string(key)
		d.push(name)
		if _, dup := m[name]; dup && d.strict {
			d.problems = append(d.problems, problem{path: d.pathString(), msg: "duplicate field", dup: true})
		}
		v := ""
		if err := d.str(&v); err != nil {
			return err
		}
		m[name] = v
		d.pop()
	}
	*dst = m
	return nil
}

// list reads a list whose elements elem decodes. An empty list is an
// empty slice and null leaves dst nil, as with encoding/json.
func list[T any](d *dec, dst *[]T, elem func(*T) error) error {
	k, err := d.src.peek()
	if err != nil {
		return err
	}
	switch k {
	case kNull:
		*dst = nil
		return d.src.skip()
	case kArray:
	default:
		return d.wrong("a list", k)
	}
	if err := d.src.enterArray(); err != nil {
		return err
	}
	out := make([]T, 0, 1)
	for i := 0; ; i++ {
		ok, err := d.src.elem()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		out = append(out, *new(T))
		d.pushIdx(i)
		err = elem(&out[i])
		d.pop()
		if err != nil {
			return err
		}
	}
	*dst = out
	return nil
}

// strList reads a list of strings.
func (d *dec) strList(dst *[]string) error {
	return list(d, dst, d.str)
}
