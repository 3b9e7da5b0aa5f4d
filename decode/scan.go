package decode

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner is a strict streaming JSON reader (RFC 8259). It reads through a
// window that it refills from an io.Reader, so a document of any size
// needs memory for its largest single token only. Values the decoders
// skip are checked for syntax but never copied.
type scanner struct {
	r   io.Reader
	buf []byte
	pos int // next unread byte
	end int // bytes of buf that hold data
	eof bool
	// consumed counts bytes before buf[0], for error offsets.
	consumed int64
	// stack holds, per open container, '}' or ']'; first, whether the
	// next member or element is its first.
	stack []byte
	first []bool
	// str holds unescaped strings.
	strBuf []byte
	// capture, when set, receives every byte consumed; capStart is where,
	// in buf, the bytes not yet copied to it begin.
	capture  *[]byte
	capStart int
	// keyBuf holds the last object key.
	keyBuf []byte
}

const minWindow = 256 << 10

// maxNesting is how deep arrays and objects may nest in one document, as
// encoding/json and the YAML decoder allow: deeper is refused, not
// walked (a skipped value's brackets cost memory for each level).
const maxNesting = 10000

// errTooDeep is the syntax error of a value nested deeper than maxNesting.
func (s *scanner) errTooDeep() error {
	return s.errorf("exceeded max depth of %d nested arrays and objects", maxNesting)
}

func newScanner(r io.Reader) *scanner {
	return &scanner{r: r, buf: make([]byte, minWindow)}
}

// newBytesScanner reads a document already in memory.
func newBytesScanner(b []byte) *scanner {
	return &scanner{buf: b, end: len(b), eof: true}
}

// syntaxError is a document that is not JSON: it ends decoding of the
// whole stream.
type syntaxError struct {
	offset int64
	msg    string
}

func (e *syntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.offset, e.msg)
}

func (s *scanner) errorf(format string, args ...any) error {
	return &syntaxError{s.consumed + int64(s.pos), fmt.Sprintf(format, args...)}
}

// more reads at least one more byte into the window, keeping buf[pos:].
// It returns false at the end of input.
func (s *scanner) more() (bool, error) {
	if s.eof {
		return false, nil
	}
	if s.pos > 0 {
		s.flushCapture()
		n := copy(s.buf, s.buf[s.pos:s.end])
		s.consumed += int64(s.pos)
		s.pos, s.end = 0, n
		s.capStart = 0
	}
	if s.end == len(s.buf) {
		nb := make([]byte, 2*len(s.buf))
		copy(nb, s.buf[:s.end])
		s.buf = nb
	}
	for {
		n, err := s.r.Read(s.buf[s.end:])
		s.end += n
		if err == io.EOF {
			s.eof = true
			return n > 0, nil
		}
		if err != nil {
			return false, fmt.Errorf("read: %w", err)
		}
		if n > 0 {
			return true, nil
		}
	}
}

// flushCapture copies the bytes consumed since the last flush to capture.
func (s *scanner) flushCapture() {
	if s.capture != nil && s.pos > s.capStart {
		*s.capture = append(*s.capture, s.buf[s.capStart:s.pos]...)
	}
	s.capStart = s.pos
}

var errEOF = errors.New("unexpected end of JSON input")

// ws skips whitespace and returns the next byte without consuming it;
// ok is false at the end of input. Indentation is skipped eight bytes at a
// time.
func (s *scanner) ws() (byte, bool, error) {
	for {
		buf, pos, end := s.buf, s.pos, s.end
		for pos < end {
			c := buf[pos]
			if c > ' ' {
				s.pos = pos
				return c, true, nil
			}
			if c != ' ' && c != '\n' && c != '\r' && c != '\t' {
				s.pos = pos
				return c, true, nil
			}
			pos++
			for pos+8 <= end && binary.LittleEndian.Uint64(buf[pos:]) == spaces {
				pos += 8
			}
		}
		s.pos = pos
		ok, err := s.more()
		if err != nil {
			return 0, false, err
		}
		if !ok {
			return 0, false, nil
		}
	}
}

const (
	spaces = 0x2020202020202020
	ones   = 0x0101010101010101
	highs  = 0x8080808080808080
)

// stringStop returns a word with the high bit set in the lowest byte of w
// that ends the fast scan of a string (a quote, a backslash or a control
// character), and possibly in higher bytes too: only the lowest is exact.
func stringStop(w uint64) uint64 {
	q, b := w^(ones*'"'), w^(ones*'\\')
	return ((w-ones*0x20)&^w | (q-ones)&^q | (b-ones)&^b) & highs
}

// structStop returns a word with the high bit set in the lowest byte of w
// that splitObject must look at outside strings (a quote or a bracket),
// and possibly in higher bytes too: only the lowest is exact. Setting
// bit 5 folds '[' into '{' and ']' into '}', and no other byte.
func structStop(w uint64) uint64 {
	f := w | spaces
	q, o, c := w^(ones*'"'), f^(ones*'{'), f^(ones*'}')
	return ((q-ones)&^q | (o-ones)&^o | (c-ones)&^c) & highs
}

// need returns the next non-space byte, failing at the end of input.
func (s *scanner) need() (byte, error) {
	// The fast path (a token right here) is small enough to inline.
	if s.pos < s.end {
		if c := s.buf[s.pos]; c > ' ' {
			return c, nil
		}
	}
	return s.needSlow()
}

func (s *scanner) needSlow() (byte, error) {
	c, ok, err := s.ws()
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, s.errorf("%v", errEOF)
	}
	return c, nil
}

// strStop marks bytes that end the fast scan of a string: the quote, the
// backslash and control characters (which JSON forbids in strings).
var strStop = func() (t [256]bool) {
	for i := 0; i < 0x20; i++ {
		t[i] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// scanString consumes a string token at pos and returns its raw content
// (between the quotes, escapes not yet decoded), valid until the next
// call, and whether it holds escapes.
func (s *scanner) scanString() (raw []byte, escaped bool, err error) {
	i := s.pos + 1
	for {
		buf, end := s.buf, s.end
		for i+8 <= end {
			if m := stringStop(binary.LittleEndian.Uint64(buf[i:])); m != 0 {
				i += bits.TrailingZeros64(m) / 8
				break
			}
			i += 8
		}
		for i < end && !strStop[buf[i]] {
			i++
		}
		if i >= end {
			rel := i - s.pos
			ok, err := s.more()
			if err != nil {
				return nil, false, err
			}
			if !ok {
				return nil, false, s.errorf("unterminated string")
			}
			i = s.pos + rel
			continue
		}
		switch c := buf[i]; {
		case c == '"':
			raw = buf[s.pos+1 : i]
			s.pos = i + 1
			return raw, escaped, nil
		case c == '\\':
			escaped = true
			for i+1 >= s.end || (s.buf[i+1] == 'u' && i+5 >= s.end) {
				rel := i - s.pos
				ok, err := s.more()
				if err != nil {
					return nil, false, err
				}
				if !ok {
					return nil, false, s.errorf("unterminated string")
				}
				i = s.pos + rel
			}
			switch s.buf[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for _, h := range s.buf[i+2 : i+6] {
					if unhex(h) < 0 {
						return nil, false, s.errorf("invalid \\u escape in string")
					}
				}
				i += 6
			default:
				return nil, false, s.errorf("invalid escape \\%c in string", s.buf[i+1])
			}
		default:
			return nil, false, s.errorf("control character %#x in string", c)
		}
	}
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// unescape decodes a raw string (already checked by scanString) into
// s.str, replacing invalid UTF-8 and lone surrogates with U+FFFD as
// encoding/json does.
func (s *scanner) unescape(raw []byte) []byte {
	out := s.strBuf[:0]
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		switch raw[i+1] {
		case '"', '\\', '/':
			out = append(out, raw[i+1])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := hex4(raw[i+2 : i+6])
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if r2 := utf16.DecodeRune(r, hex4(raw[i+2:i+6])); r2 != utf8.RuneError {
						out = utf8.AppendRune(out, r2)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
			continue
		}
		i += 2
	}
	s.strBuf = out
	return out
}

func hex4(b []byte) rune {
	return rune(unhex(b[0])<<12 | unhex(b[1])<<8 | unhex(b[2])<<4 | unhex(b[3]))
}

// text turns a raw string into its value, valid until the next call.
func (s *scanner) text(raw []byte, escaped bool) []byte {
	if escaped {
		raw = s.unescape(raw)
	}
	if !utf8.Valid(raw) {
		s.strBuf = []byte(string([]rune(string(raw))))
		return s.strBuf
	}
	return raw
}

// scanNumber consumes a number token and returns it, valid until the next
// call.
func (s *scanner) scanNumber() ([]byte, error) {
	i := s.pos
	for {
		for i < s.end && isNumByte(s.buf[i]) {
			i++
		}
		if i < s.end || s.eof {
			break
		}
		rel := i - s.pos
		ok, err := s.more()
		if err != nil {
			return nil, err
		}
		i = s.pos + rel
		if !ok {
			break
		}
	}
	num := s.buf[s.pos:i]
	if !validNumber(num) {
		return nil, s.errorf("invalid number %q", num)
	}
	s.pos = i
	return num, nil
}

func isNumByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// validNumber checks the JSON number grammar.
func validNumber(b []byte) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		j := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == j {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == j {
			return false
		}
	}
	return i == len(b)
}

// literal consumes true, false or null.
func (s *scanner) literal(want string) error {
	for s.end-s.pos < len(want) {
		ok, err := s.more()
		if err != nil {
			return err
		}
		if !ok {
			return s.errorf("invalid literal")
		}
	}
	if string(s.buf[s.pos:s.pos+len(want)]) != want {
		return s.errorf("invalid character %q looking for a value", s.buf[s.pos])
	}
	s.pos += len(want)
	return nil
}

// The source interface.

func (s *scanner) peek() (vkind, error) {
	c, err := s.need()
	if err != nil {
		return 0, err
	}
	switch {
	case c == '{':
		return kObject, nil
	case c == '[':
		return kArray, nil
	case c == '"':
		return kString, nil
	case c == 't' || c == 'f':
		return kBool, nil
	case c == 'n':
		return kNull, nil
	case c == '-' || '0' <= c && c <= '9':
		return kNumber, nil
	}
	return 0, s.errorf("invalid character %q looking for a value", c)
}

func (s *scanner) bytes() ([]byte, error) {
	if _, err := s.need(); err != nil {
		return nil, err
	}
	raw, esc, err := s.scanString()
	if err != nil {
		return nil, err
	}
	return s.text(raw, esc), nil
}

func (s *scanner) str() (string, error) {
	b, err := s.bytes()
	return string(b), err
}

func (s *scanner) integer() (int64, bool, string, error) {
	if _, err := s.need(); err != nil {
		return 0, false, "", err
	}
	num, err := s.scanNumber()
	if err != nil {
		return 0, false, "", err
	}
	v, perr := strconv.ParseInt(string(num), 10, 64)
	if perr != nil {
		return 0, false, string(num), nil
	}
	return v, true, "", nil
}

func (s *scanner) boolean() (bool, error) {
	c, err := s.need()
	if err != nil {
		return false, err
	}
	if c == 't' {
		return true, s.literal("true")
	}
	return false, s.literal("false")
}

func (s *scanner) enterObject() error {
	s.pos++ // '{'
	s.stack = append(s.stack, '}')
	s.first = append(s.first, true)
	return nil
}

func (s *scanner) enterArray() error {
	s.pos++ // '['
	s.stack = append(s.stack, ']')
	s.first = append(s.first, true)
	return nil
}

// closeOrComma consumes the separator before the next member or element,
// or the closing bracket (then it returns false).
func (s *scanner) closeOrComma() (bool, error) {
	c, err := s.need()
	if err != nil {
		return false, err
	}
	top := len(s.stack) - 1
	if c == s.stack[top] {
		s.pos++
		s.stack, s.first = s.stack[:top], s.first[:top]
		return false, nil
	}
	if s.first[top] {
		s.first[top] = false
		return true, nil
	}
	if c != ',' {
		return false, s.errorf("invalid character %q after %s", c, containerName(s.stack[top]))
	}
	s.pos++
	return true, nil
}

func containerName(closer byte) string {
	if closer == '}' {
		return "object member"
	}
	return "array element"
}

func (s *scanner) key() ([]byte, bool, error) {
	more, err := s.closeOrComma()
	if err != nil || !more {
		return nil, false, err
	}
	c, err := s.need()
	if err != nil {
		return nil, false, err
	}
	if c != '"' {
		return nil, false, s.errorf("invalid character %q looking for an object key", c)
	}
	raw, esc, err := s.scanString()
	if err != nil {
		return nil, false, err
	}
	// Keys are compared with field names, not kept: they need no UTF-8
	// check (an invalid name is unknown, whatever its bytes).
	k := raw
	if esc {
		k = s.unescape(raw)
	}
	if s.pos < s.end && s.buf[s.pos] == ':' {
		// Compact JSON: no refill can move the key.
		s.pos++
		return k, true, nil
	}
	// Whitespace before the colon may need a refill: copy the key first.
	c, ok, err := s.wsKeep(k)
	if err != nil {
		return nil, false, err
	}
	if !ok || c != ':' {
		return nil, false, s.errorf("missing colon after object key")
	}
	s.pos++
	return s.keyBuf, true, nil
}

// wsKeep skips whitespace like ws but first copies k (which may point into
// the window) to keyBuf, so a refill cannot overwrite it.
func (s *scanner) wsKeep(k []byte) (byte, bool, error) {
	s.keyBuf = append(s.keyBuf[:0], k...)
	return s.ws()
}

func (s *scanner) elem() (bool, error) {
	return s.closeOrComma()
}

// skip consumes one value, checking its syntax. It is the scanner's
// hottest loop (most of a pod is skipped), so it walks the window with
// local variables; a token cut by the end of the window is read again
// from its start after a refill.
func (s *scanner) skip() error {
	const (
		value      = iota // a value
		valueOrEnd        // after '[': a value or ']'
		keyOrEnd          // after '{': a key or '}'
		key               // after ',' in an object
		colon             // after a key
		after             // after a value: ',' or the closer
	)
	var nesting [32]byte // grows on the heap only for deeper values
	stack := nesting[:0]
	deepest := maxNesting - len(s.stack) // the containers stack may hold
	buf, pos, end := s.buf, s.pos, s.end
	state := value
	resume := 0 // how far a string cut by the window was scanned
	for {
		for pos < end {
			c := buf[pos]
			if c > ' ' {
				break
			}
			if c != ' ' && c != '\n' && c != '\r' && c != '\t' {
				s.pos = pos
				return s.errorf("invalid character %q looking for a value", c)
			}
			pos++
			for pos+8 <= end && binary.LittleEndian.Uint64(buf[pos:]) == spaces {
				pos += 8
			}
		}
		if pos >= end {
			s.pos = pos
			ok, err := s.more()
			if err != nil {
				return err
			}
			if !ok {
				return s.errorf("%v", errEOF)
			}
			buf, pos, end = s.buf, s.pos, s.end
			continue
		}
		c := buf[pos]
		switch state {
		case after:
			top := stack[len(stack)-1]
			switch c {
			case ',':
				pos++
				state = value
				if top == '}' {
					state = key
				}
			case top:
				pos++
				stack = stack[:len(stack)-1]
				if len(stack) == 0 {
					s.pos = pos
					return nil
				}
			default:
				s.pos = pos
				return s.errorf("invalid character %q after %s", c, containerName(top))
			}
			continue
		case colon:
			if c != ':' {
				s.pos = pos
				return s.errorf("missing colon after object key")
			}
			pos++
			state = value
			continue
		case keyOrEnd, key:
			if c == '}' && state == keyOrEnd {
				pos++
				stack = stack[:len(stack)-1]
				state = after
				if len(stack) == 0 {
					s.pos = pos
					return nil
				}
				continue
			}
			if c != '"' {
				s.pos = pos
				return s.errorf("invalid character %q looking for an object key", c)
			}
		case valueOrEnd:
			if c == ']' {
				pos++
				stack = stack[:len(stack)-1]
				state = after
				if len(stack) == 0 {
					s.pos = pos
					return nil
				}
				continue
			}
		}
		// A value, or a key (a string).
		next := after
		if state == keyOrEnd || state == key {
			next = colon
		}
		switch {
		case c == '"':
			i := pos + 1 + resume
			resume = 0
			for {
				for i+8 <= end {
					if m := stringStop(binary.LittleEndian.Uint64(buf[i:])); m != 0 {
						i += bits.TrailingZeros64(m) / 8
						break
					}
					i += 8
				}
				for i < end && !strStop[buf[i]] {
					i++
				}
				if i >= end {
					resume = i - pos - 1
					break
				}
				if buf[i] == '"' {
					break
				}
				if buf[i] != '\\' {
					s.pos = i
					return s.errorf("control character %#x in string", buf[i])
				}
				if i+1 >= end || (buf[i+1] == 'u' && i+5 >= end) {
					resume = i - pos - 1 // at the backslash
					i = end
					break
				}
				switch buf[i+1] {
				case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
					i += 2
				case 'u':
					for _, h := range buf[i+2 : i+6] {
						if unhex(h) < 0 {
							s.pos = i
							return s.errorf("invalid \\u escape in string")
						}
					}
					i += 6
				default:
					s.pos = i
					return s.errorf("invalid escape \\%c in string", buf[i+1])
				}
			}
			if i >= end {
				// Cut by the window: read more and go on where the scan
				// stopped (at a character, never inside an escape).
				s.pos = pos
				ok, err := s.more()
				if err != nil {
					return err
				}
				if !ok {
					return s.errorf("unterminated string")
				}
				buf, pos, end = s.buf, s.pos, s.end
				continue
			}
			pos = i + 1
		case next == colon:
			s.pos = pos
			return s.errorf("invalid character %q looking for an object key", c)
		case c == '{':
			if len(stack) >= deepest {
				s.pos = pos
				return s.errTooDeep()
			}
			pos++
			stack = append(stack, '}')
			state = keyOrEnd
			continue
		case c == '[':
			if len(stack) >= deepest {
				s.pos = pos
				return s.errTooDeep()
			}
			pos++
			stack = append(stack, ']')
			state = valueOrEnd
			continue
		case c == 't' || c == 'f' || c == 'n':
			lit := "null"
			if c == 't' {
				lit = "true"
			} else if c == 'f' {
				lit = "false"
			}
			if end-pos < len(lit) && !s.eof {
				s.pos = pos
				if _, err := s.more(); err != nil {
					return err
				}
				buf, pos, end = s.buf, s.pos, s.end
				continue
			}
			if end-pos < len(lit) || string(buf[pos:pos+len(lit)]) != lit {
				s.pos = pos
				return s.errorf("invalid character %q looking for a value", c)
			}
			pos += len(lit)
		case c == '-' || '0' <= c && c <= '9':
			i := pos
			for i < end && isNumByte(buf[i]) {
				i++
			}
			if i >= end && !s.eof {
				s.pos = pos
				if _, err := s.more(); err != nil {
					return err
				}
				buf, pos, end = s.buf, s.pos, s.end
				continue
			}
			if !validNumber(buf[pos:i]) {
				s.pos = pos
				return s.errorf("invalid number %q", buf[pos:i])
			}
			pos = i
		default:
			s.pos = pos
			return s.errorf("invalid character %q looking for a value", c)
		}
		state = next
		if next == after && len(stack) == 0 {
			s.pos = pos
			return nil
		}
	}
}

// captureValue copies the next value's bytes and returns a source over
// them, for an object whose kind is only known after its body.
func (s *scanner) captureValue() (source, error) {
	if _, err := s.need(); err != nil {
		return nil, err
	}
	var b []byte
	s.capture, s.capStart = &b, s.pos
	err := s.skip()
	s.flushCapture()
	s.capture = nil
	if err != nil {
		return nil, err
	}
	return newBytesScanner(b), nil
}

// structural marks the bytes splitObject stops at outside strings.
var structural = func() (t [256]bool) {
	for _, c := range []byte(`"{}[]`) {
		t[c] = true
	}
	return t
}()

// splitObject consumes the object the scanner is at (its '{'), appending
// its bytes to dst, by following strings and brackets only: the caller
// has a worker decode (and so fully check) those bytes, and checks itself
// what comes between objects.
func (s *scanner) splitObject(dst *[]byte) error {
	buf, pos, end := s.buf, s.pos, s.end
	start, depth, inString := pos, 0, false
	for {
		for pos < end {
			if inString {
				for pos+8 <= end {
					if m := stringStop(binary.LittleEndian.Uint64(buf[pos:])); m != 0 {
						pos += bits.TrailingZeros64(m) / 8
						break
					}
					pos += 8
				}
				if pos >= end {
					break
				}
				switch buf[pos] {
				case '\\':
					pos++ // the escaped byte is never a quote that ends the string
				case '"':
					inString = false
				}
				pos++
				continue
			}
			// Outside strings most bytes are indentation and scalars:
			// skip them a word at a time, as in strings.
			for pos+8 <= end {
				if m := structStop(binary.LittleEndian.Uint64(buf[pos:])); m != 0 {
					pos += bits.TrailingZeros64(m) / 8
					break
				}
				pos += 8
			}
			if pos >= end {
				break
			}
			c := buf[pos]
			pos++
			if !structural[c] {
				continue
			}
			switch c {
			case '"':
				inString = true
			case '{', '[':
				if depth++; len(s.stack)+depth > maxNesting {
					s.pos = pos - 1
					return s.errTooDeep()
				}
			default:
				depth--
				if depth == 0 {
					*dst = append(*dst, buf[start:pos]...)
					s.pos = pos
					return nil
				}
			}
		}
		// The window is used up: keep what it held, read on.
		*dst = append(*dst, buf[start:min(pos, end)]...)
		s.pos = end
		ok, err := s.more()
		if err != nil {
			return err
		}
		if !ok {
			return s.errorf("%v", errEOF)
		}
		buf, pos, end = s.buf, s.pos+(pos-end), s.end
		start = s.pos
	}
}
