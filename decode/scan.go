package decode

import (
	"errors"
	"fmt"
	"io"
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
	// skipStack is reused by skip.
	skipStack []byte
	intern    map[string]string
	// capture, when set, receives every byte consumed; capStart is where,
	// in buf, the bytes not yet copied to it begin.
	capture  *[]byte
	capStart int
	// keyBuf holds the last object key.
	keyBuf []byte
}

const minWindow = 64 << 10

func newScanner(r io.Reader, intern map[string]string) *scanner {
	return &scanner{r: r, buf: make([]byte, minWindow), intern: intern}
}

// newBytesScanner reads a document already in memory.
func newBytesScanner(b []byte, intern map[string]string) *scanner {
	return &scanner{buf: b, end: len(b), eof: true, intern: intern}
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
// ok is false at the end of input.
func (s *scanner) ws() (byte, bool, error) {
	for {
		for s.pos < s.end {
			c := s.buf[s.pos]
			if c > ' ' || (c != ' ' && c != '\n' && c != '\r' && c != '\t') {
				return c, true, nil
			}
			s.pos++
		}
		ok, err := s.more()
		if err != nil {
			return 0, false, err
		}
		if !ok {
			return 0, false, nil
		}
	}
}

// need returns the next non-space byte, failing at the end of input.
func (s *scanner) need() (byte, error) {
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

func (s *scanner) istr() (string, error) {
	b, err := s.bytes()
	if err != nil {
		return "", err
	}
	if v, ok := s.intern[string(b)]; ok {
		return v, nil
	}
	v := string(b)
	if s.intern != nil {
		s.intern[v] = v
	}
	return v, nil
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
	k := s.text(raw, esc)
	// The key stays valid: a colon needs no refill unless the window is
	// exhausted, in which case copy it first.
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

// skip consumes one value, checking its syntax.
func (s *scanner) skip() error {
	stack := s.skipStack[:0]
	defer func() { s.skipStack = stack[:0] }()
	for {
		// A value.
		c, err := s.need()
		if err != nil {
			return err
		}
		switch {
		case c == '"':
			if _, _, err := s.scanString(); err != nil {
				return err
			}
		case c == '{' || c == '[':
			s.pos++
			closer := byte('}')
			if c == '[' {
				closer = ']'
			}
			n, err := s.need()
			if err != nil {
				return err
			}
			if n == closer {
				s.pos++
				break
			}
			stack = append(stack, closer)
			if closer == '}' {
				if err := s.skipKey(); err != nil {
					return err
				}
			}
			continue
		case c == 't':
			err = s.literal("true")
		case c == 'f':
			err = s.literal("false")
		case c == 'n':
			err = s.literal("null")
		case c == '-' || '0' <= c && c <= '9':
			_, err = s.scanNumber()
		default:
			return s.errorf("invalid character %q looking for a value", c)
		}
		if err != nil {
			return err
		}
		// After a value: close containers or move to the next value.
		for {
			if len(stack) == 0 {
				return nil
			}
			c, err := s.need()
			if err != nil {
				return err
			}
			top := stack[len(stack)-1]
			if c == top {
				s.pos++
				stack = stack[:len(stack)-1]
				continue
			}
			if c != ',' {
				return s.errorf("invalid character %q after %s", c, containerName(top))
			}
			s.pos++
			if top == '}' {
				if err := s.skipKey(); err != nil {
					return err
				}
			}
			break
		}
	}
}

func (s *scanner) skipKey() error {
	c, err := s.need()
	if err != nil {
		return err
	}
	if c != '"' {
		return s.errorf("invalid character %q looking for an object key", c)
	}
	if _, _, err := s.scanString(); err != nil {
		return err
	}
	if c, err = s.need(); err != nil {
		return err
	}
	if c != ':' {
		return s.errorf("missing colon after object key")
	}
	s.pos++
	return nil
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
	return newBytesScanner(b, s.intern), nil
}
