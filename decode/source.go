package decode

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"unsafe"
)

// vkind is the JSON type of a value.
type vkind uint8

const (
	kInvalid vkind = iota
	kNull
	kBool
	kNumber
	kString
	kArray
	kObject
)

func (k vkind) String() string {
	return [...]string{"an unsupported value", "null", "a boolean", "a number", "a string", "a list", "an object"}[k]
}

// source yields one JSON value at a time, from a byte stream (scanner) or
// from an already decoded tree (the maps of client-go's unstructured
// objects). The object decoders read through it, so files and informers go
// through one decoder. Errors it returns are fatal for the document (bad
// syntax, a failed read); wrong types are the decoders' business.
type source interface {
	// peek returns the type of the next value without consuming it.
	peek() (vkind, error)
	// str consumes a string.
	str() (string, error)
	// integer consumes a number. ok is false when it is not an integer
	// that fits 64 bits; text then says what it was.
	integer() (v int64, ok bool, text string, err error)
	boolean() (bool, error)
	// skip consumes the next value, whatever it is.
	skip() error
	// enterObject consumes the opening of an object; key then returns each
	// member's name (valid until the next call), leaving its value next,
	// and false after the last one.
	enterObject() error
	key() ([]byte, bool, error)
	// enterArray and elem are the same for arrays.
	enterArray() error
	elem() (bool, error)
	// captureValue consumes the next value and returns a source that
	// replays it.
	captureValue() (source, error)
}

// tree is a source over a JSON-shaped Go value: map[string]any, []any,
// string, bool, nil and numbers (int64, float64, json.Number, and the
// other integer types), as client-go's unstructured objects hold them.
// Object members come in name order.
type tree struct {
	// next is the pending value; stack the open containers.
	next  any
	stack []frame
}

type frame struct {
	obj  map[string]any
	keys []string
	arr  []any
	i    int
}

func newTree(v any) *tree { return &tree{next: v} }

func (t *tree) peek() (vkind, error) {
	switch v := t.next.(type) {
	case nil:
		return kNull, nil
	case bool:
		return kBool, nil
	case string:
		return kString, nil
	case map[string]any:
		return kObject, nil
	case []any:
		return kArray, nil
	case int64, int32, int, float64, float32, json.Number, uint64, uint32:
		return kNumber, nil
	default:
		_ = v
		return kInvalid, nil
	}
}

func (t *tree) str() (string, error) {
	s, _ := t.next.(string)
	t.next = nil
	return s, nil
}

func (t *tree) integer() (int64, bool, string, error) {
	v := t.next
	t.next = nil
	switch n := v.(type) {
	case int64:
		return n, true, "", nil
	case int32:
		return int64(n), true, "", nil
	case int:
		return int64(n), true, "", nil
	case uint32:
		return int64(n), true, "", nil
	case uint64:
		if n <= math.MaxInt64 {
			return int64(n), true, "", nil
		}
		return 0, false, strconv.FormatUint(n, 10), nil
	case json.Number:
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			return i, true, "", nil
		}
		return 0, false, string(n), nil
	case float64:
		// encoding/json into any gives float64 for every number; one
		// that is integral was written as an integer or could have been
		// (the unstructured converter accepts it for integer fields too).
		if n == math.Trunc(n) && math.Abs(n) < 1<<53 {
			return int64(n), true, "", nil
		}
		return 0, false, strconv.FormatFloat(n, 'g', -1, 64), nil
	case float32:
		return 0, false, strconv.FormatFloat(float64(n), 'g', -1, 32), nil
	}
	return 0, false, fmt.Sprint(v), nil
}

func (t *tree) boolean() (bool, error) {
	b, _ := t.next.(bool)
	t.next = nil
	return b, nil
}

func (t *tree) skip() error {
	t.next = nil
	return nil
}

func (t *tree) enterObject() error {
	m, _ := t.next.(map[string]any)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	t.stack = append(t.stack, frame{obj: m, keys: keys})
	t.next = nil
	return nil
}

func (t *tree) key() ([]byte, bool, error) {
	f := &t.stack[len(t.stack)-1]
	if f.i == len(f.keys) {
		t.stack = t.stack[:len(t.stack)-1]
		return nil, false, nil
	}
	k := f.keys[f.i]
	f.i++
	t.next = f.obj[k]
	// The decoders only read the name.
	return unsafe.Slice(unsafe.StringData(k), len(k)), true, nil
}

func (t *tree) enterArray() error {
	a, _ := t.next.([]any)
	t.stack = append(t.stack, frame{arr: a})
	t.next = nil
	return nil
}

func (t *tree) elem() (bool, error) {
	f := &t.stack[len(t.stack)-1]
	if f.i == len(f.arr) {
		t.stack = t.stack[:len(t.stack)-1]
		return false, nil
	}
	t.next = f.arr[f.i]
	f.i++
	return true, nil
}

func (t *tree) captureValue() (source, error) {
	v := t.next
	t.next = nil
	return newTree(v), nil
}
