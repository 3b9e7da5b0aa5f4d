#!/usr/bin/env bash
# Issues one node's moat-proxy-agent client certificate: subject CN
# system:node:<node>, the node's name as a DNS SAN and the given addresses
# and names as further SANs, for client authentication only, signed by the
# agent CA (the CA of moat-proxy-server's --cluster-ca-cert). Each node gets
# its own certificate, so the server can hold each agent to its node
# (--agent-identity-binding, docs/tunnel.md "Authentication"): its agentID
# must be <node> (the agent's default --agent-id with such a certificate)
# and it may claim only host=/ipv4=/ipv6= identifiers among these SANs. The
# agent claims them all (--identifiers-from-cert, its default), and the
# server sends the connections kube-apiserver makes to these names and
# addresses (the kubelet's) to this node's agent only.
#
# Usage: issue-agent-cert.sh NODE ADDRESS [ADDRESS_OR_NAME...]
#   NODE  the Node's name (kubectl get nodes; the kubelet's --hostname-override)
#   ADDRESS  the node's IP address kube-apiserver reaches its kubelet at
#         (its InternalIP); required: without it the node's connections are
#         not routed to its own agent
#   ADDRESS_OR_NAME  further IP addresses and DNS names of the node (an
#         ExternalIP, its Hostname address)
# Environment:
#   CA_CERT  agent CA certificate (default /etc/kubernetes/pki/konnectivity/agent-ca.crt)
#   CA_KEY   its private key (default /etc/kubernetes/pki/konnectivity/agent-ca.key)
#   OUT      directory for agent.crt and agent.key (default ./NODE); copy
#            both to the node's /etc/kubernetes/pki/konnectivity/
#   DAYS     validity in days (default 365); reissue before it ends
#
# Use a CA of its own for agents, not the cluster CA: kube-apiserver
# accepts a certificate of its client CA as a login, and this one names
# user system:node:<node>; and the other way, a bootstrap-token holder can
# have a cluster-CA certificate for any node's name approved (kubeadm's
# auto-approval of node client CSRs), which an agent CA that is the
# cluster CA would accept as that node's agent.
set -euo pipefail

if [[ $# -lt 2 || $1 == -* ]]; then
	sed -n '/^# Usage:/,/^# *DAYS/p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
fi
node=$1
shift
ca_cert=${CA_CERT:-/etc/kubernetes/pki/konnectivity/agent-ca.crt}
ca_key=${CA_KEY:-/etc/kubernetes/pki/konnectivity/agent-ca.key}
out=${OUT:-./${node}}
days=${DAYS:-365}

# A Node's name is a DNS subdomain (RFC 1123); checking it here also keeps
# it from smuggling fields into the subject or the extensions below.
dns='^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'
if [[ ! ${node} =~ ${dns} || ${#node} -gt 253 ]]; then
	echo "issue-agent-cert.sh: node name ${node@Q} is not a lower-case DNS subdomain (RFC 1123), as Node names are" >&2
	exit 2
fi
# The subject CN system:node:<node> may be at most 64 characters
# (X.509's ub-common-name, which openssl enforces): 52 for the name.
if (( ${#node} > 52 )); then
	echo "issue-agent-cert.sh: node name ${node@Q} is ${#node} characters; the certificate's CN system:node:<node> allows at most 52 (X.509 limits a CN to 64)" >&2
	exit 2
fi
if [[ ! ${days} =~ ^[1-9][0-9]*$ ]]; then
	echo "issue-agent-cert.sh: DAYS=${days@Q} is not a positive number of days" >&2
	exit 2
fi
sans="DNS:${node}"
if [[ ! ${1} =~ ^[0-9.]+$ && ${1} != *:* ]]; then
	echo "issue-agent-cert.sh: ${1@Q} is not an IP address: give the node's address (its InternalIP) after its name, so that its kube-apiserver connections are routed to its own agent" >&2
	exit 2
fi
for san in "$@"; do
	if [[ ${san} =~ ^[0-9.]+$ || ${san} == *:* ]]; then
		# openssl refuses a malformed IP SAN, naming it.
		if [[ ! ${san} =~ ^[0-9a-fA-F.:]+$ ]]; then
			echo "issue-agent-cert.sh: ${san@Q} is not an IP address (zones are not allowed)" >&2
			exit 2
		fi
		sans+=",IP:${san}"
	elif [[ ${san,,} =~ ${dns} ]]; then
		sans+=",DNS:${san,,}"
	else
		echo "issue-agent-cert.sh: ${san@Q} is neither an IP address nor a DNS name" >&2
		exit 2
	fi
done
for f in "${ca_cert}" "${ca_key}"; do
	[[ -r ${f} ]] || { echo "issue-agent-cert.sh: cannot read ${f} (set CA_CERT and CA_KEY)" >&2; exit 1; }
done

umask 077
mkdir -p "${out}"
tmp=$(mktemp -d)
trap 'rm -rf "${tmp}"' EXIT
cat >"${tmp}/ext.cnf" <<EXT
[agent]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = ${sans}
EXT
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
	-keyout "${tmp}/agent.key" -subj "/CN=system:node:${node}" -out "${tmp}/agent.csr" 2>"${tmp}/req.err" ||
	{ echo "issue-agent-cert.sh: openssl req failed:" >&2; cat "${tmp}/req.err" >&2; exit 1; }
openssl x509 -req -in "${tmp}/agent.csr" -CA "${ca_cert}" -CAkey "${ca_key}" \
	-set_serial "0x$(openssl rand -hex 16)" -days "${days}" -sha256 \
	-extfile "${tmp}/ext.cnf" -extensions agent -out "${tmp}/agent.crt"
mv "${tmp}/agent.key" "${out}/agent.key"
chmod 0644 "${tmp}/agent.crt"
mv "${tmp}/agent.crt" "${out}/agent.crt"
echo "issued ${out}/agent.crt (CN system:node:${node}, SANs ${sans}) and ${out}/agent.key" >&2
