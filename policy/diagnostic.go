package policy

import "fmt"

// Severity grades a diagnostic.
type Severity string

// Errors are what the API server would reject; warnings are legal input
// that cannot be fully honoured (a pod without an IP, a named port that
// resolves nowhere). moat check fails on errors; the commands that judge
// traffic fail only on objects that could not be loaded, and show the
// errors of objects they judge around (the value left out or the part
// failed closed, as moat-agent enforces it) as warnings.
const (
	SeverityError   Severity = "error"
	SeverityWarning Severity = "warning"
)

// Diagnostic is one finding about one object, with its field path.
type Diagnostic struct {
	Severity Severity `json:"severity"`
	// Object is "Kind namespace/name" or "Kind name".
	Object string `json:"object"`
	// Field is a field path such as "spec.ingress[0].ports[1].endPort";
	// empty when the finding is about the whole object.
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	// Source is the file (and document) the object came from, if known.
	Source string `json:"source,omitempty"`
}

// String is the `moat check` form: "<Kind> <ns/name>: <field>: <message>".
func (d Diagnostic) String() string {
	s := d.Object + ": "
	if d.Field != "" {
		s += d.Field + ": "
	}
	s += d.Message
	if d.Source != "" {
		s = fmt.Sprintf("%s (%s)", s, d.Source)
	}
	return s
}
