// Package netfault holds the network faults the field fears most, each a
// test on the local stack with links (stack.Config.Links): the rail's
// answer lost after it paid, lock-server's grant lost on its way to the
// holder, and a holder cut off from lock-server past its TTL that still
// reaches the fence points. Each judges the run from the rail's journal,
// the ledger audit and, where there is a lock history, porcupine with
// lockserver/store/lockmodel.
// docs/reliability.md has the table of faults by link.
package netfault
