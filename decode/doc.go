// Package decode turns Kubernetes objects into the policy compiler's input,
// strictly and the same way whatever their source: files and stdin (through
// package manifest), the agent's informers, and a live cluster's lists. It
// reads the five kinds Moat uses (Namespace, Pod, Node, NetworkPolicy,
// ClusterNetworkPolicy) from a JSON stream (DecodeJSON, DecodeListPage:
// `kubectl get -o json` output, API server list pages) or from client-go's
// unstructured maps (DecodeUnstructured, Unstructured), through one
// hand-written decoder per kind.
//
// Policies are decoded strictly: fields their types do not have are
// recorded (UnknownFields), and so are wrongly typed and repeated values
// and missing fields the ClusterNetworkPolicy CRD requires (Invalid), each
// with its JSON path, so that the compiler can fail closed on exactly the
// part they belong to (docs/semantics.md). A wrongly typed value is left
// empty and reported at its own path with what it must be and what it is
// ("must be a list, found an object"), so that an operator reads which
// field to fix; the compiler fails closed on the part holding that path
// as it does for an unknown field there. A spec that is not an object
// fails the whole policy; a rule list that is not a list is read as one
// empty rule, so that a NetworkPolicy still isolates that direction.
//
// Pods, Nodes and Namespaces keep only what policy needs (labels, node,
// host networking, container ports, pod IPs, node addresses); the rest is
// checked for syntax and skipped, never held. A JSON stream is read
// through a small window: memory holds the decoded objects, not the input.
//
// What a document costs is bounded by its size: Lists nested in Lists
// (kubectl flattens them) are read at most 8 deep, and no value nests
// more than 10,000 arrays and objects deep (as encoding/json and the YAML
// decoder allow); deeper is an error for the document, naming where.
//
// Objects that cannot be loaded at all (an unknown kind in a group Moat
// reads, an unsupported apiVersion, unreadable metadata, a second object
// with the same name) are Dropped: commands that judge traffic refuse to
// run without them.
package decode
