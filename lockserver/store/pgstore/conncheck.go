//go:build linux || darwin || freebsd

package pgstore

import (
	"errors"
	"net"
	"syscall"
)

// connAlive reports whether an idle connection can still be used: a
// non-blocking peek at its socket finds neither end-of-file nor unread
// bytes. An idle PostgreSQL connection has nothing to read unless the
// server is closing it (a restart sends FATAL 57P01 and closes; a killed
// server's socket reads EOF), so either finding means the connection is
// dead and the pool should discard it before use, costing one syscall
// instead of a round trip. Connections that are not plain sockets (TLS)
// are reported alive; pgxpool pings those after a second of idleness.
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var alive bool
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Only "would block" means nothing to read, the normal idle state;
		// anything else is an error, end-of-file or an unsolicited message.
		alive = errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK)
		return true // never wait for readiness
	})
	return err == nil && alive
}
