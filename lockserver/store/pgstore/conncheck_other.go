//go:build !(linux || darwin || freebsd)

package pgstore

import "net"

// connAlive cannot peek at a socket on this platform; pgxpool pings
// connections that have been idle for more than a second instead.
func connAlive(net.Conn) bool { return true }
