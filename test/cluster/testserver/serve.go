package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"sync"
	"time"
)

// Server answers each TCP connection and UDP datagram with one line, its
// name and the address it saw the client at: "<name> <ip:port>\n". A client
// learns which backend served it and whether its source address survived
// the way there.
type Server struct {
	// Name is the first word of every answer (the pod's name).
	Name string
	// Linger is how long a TCP connection stays open after the answer,
	// waiting for the client to close it first.
	Linger time.Duration
}

// answer is the line the server sends to a client seen at peer.
func (s *Server) answer(peer net.Addr) []byte {
	return []byte(s.Name + " " + peer.String() + "\n")
}

// ServeTCP answers connections on ln until ctx ends, then closes ln and the
// open connections and returns nil; any other error of Accept is returned.
func (s *Server) ServeTCP(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			c.Close()
		}
	})
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept on %s: %w", ln.Addr(), err)
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.answerTCP(c)
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
		}()
	}
}

func (s *Server) answerTCP(c net.Conn) {
	defer c.Close()
	if _, err := c.Write(s.answer(c.RemoteAddr())); err != nil {
		return
	}
	// The client closes first, so that the TIME_WAIT state is its own;
	// one that never does is cut off after Linger.
	_ = c.SetReadDeadline(time.Now().Add(s.Linger))
	_, _ = io.Copy(io.Discard, c)
}

// ServeUDP answers datagrams on pc until ctx ends, then closes pc and
// returns nil; any other read error is returned.
func (s *Server) ServeUDP(ctx context.Context, pc net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { pc.Close() })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		_, peer, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read on %s: %w", pc.LocalAddr(), err)
		}
		if _, err := pc.WriteTo(s.answer(peer), peer); err != nil {
			// An ICMP error for an earlier answer, or no route back:
			// the client times out, which is what it should see.
			log.Printf("answer %s: %v", peer, err)
		}
	}
}

// Serve listens on the given TCP and UDP ports of every address and
// answers until ctx ends. It returns once every listener is closed.
func (s *Server) Serve(ctx context.Context, tcpPorts, udpPorts []int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var lc net.ListenConfig
	for _, p := range tcpPorts {
		ln, err := lc.Listen(ctx, "tcp", fmt.Sprintf(":%d", p))
		if err != nil {
			cancel(err)
			break
		}
		log.Printf("%s: answering TCP on %s", s.Name, ln.Addr())
		wg.Go(func() {
			if err := s.ServeTCP(ctx, ln); err != nil {
				cancel(err)
			}
		})
	}
	for _, p := range udpPorts {
		if ctx.Err() != nil {
			break
		}
		pc, err := lc.ListenPacket(ctx, "udp", fmt.Sprintf(":%d", p))
		if err != nil {
			cancel(err)
			break
		}
		log.Printf("%s: answering UDP on %s", s.Name, pc.LocalAddr())
		wg.Go(func() {
			if err := s.ServeUDP(ctx, pc); err != nil {
				cancel(err)
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
