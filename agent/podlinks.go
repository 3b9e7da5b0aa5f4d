package agent

import "github.com/moat-net/moat/nft"

// reportLinks logs when the dataplane could not resolve the interfaces of
// the node's pods (nft.Result.LinksErr), once per failure streak and once
// when it recovers. Meanwhile the node keeps checking sources against the
// links it resolved last (docs/agent.md, "Forged sources"); the sync
// itself succeeded, so nothing else reports it.
func (a *Agent) reportLinks(res nft.Result) {
	msg := ""
	if res.LinksErr != nil {
		msg = res.LinksErr.Error()
	}
	switch {
	case msg == a.linksErr:
	case msg == "":
		a.log.Info("Pod interfaces resolved again", "links", res.Links)
	default:
		a.log.Error(res.LinksErr, "Could not resolve the interfaces of the node's pods; checking sources against the last ones resolved", "links", res.Links)
	}
	a.linksErr = msg
}
