package pktest

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// ARPRequest returns a broadcast ARP request from srcMAC/srcIP asking for
// target.
func ARPRequest(srcMAC net.HardwareAddr, srcIP, target netip.Addr) []byte {
	return serializeFrame(srcMAC, layers.EthernetBroadcast, EtherTypeARP,
		&layers.ARP{
			AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
			HwAddressSize: 6, ProtAddressSize: 4, Operation: layers.ARPRequest,
			SourceHwAddress: srcMAC, SourceProtAddress: srcIP.AsSlice(),
			DstHwAddress: make([]byte, 6), DstProtAddress: target.AsSlice(),
		},
	)
}

// IPv6UDP returns a frame with an IPv6 UDP datagram, with a correct
// checksum.
func IPv6UDP(src, dst netip.AddrPort, payload []byte) []byte {
	ip := &layers.IPv6{
		Version: 6, HopLimit: DefaultTTL, NextHeader: layers.IPProtocolUDP,
		SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice(),
	}
	udp := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		panic(fmt.Sprintf("pktest: %v", err))
	}
	return serializeFrame(DefaultSrcMAC, DefaultDstMAC, EtherTypeIPv6, ip, udp, gopacket.Payload(payload))
}

// Frame returns an Ethernet frame of any EtherType with the given payload.
func Frame(src, dst net.HardwareAddr, etherType uint16, payload []byte) []byte {
	return serializeFrame(src, dst, etherType, gopacket.Payload(payload))
}

// serializeFrame encodes ls behind an Ethernet header, without padding the
// frame (see linkHeader). It panics on what cannot be encoded, as
// Builder.Bytes does.
func serializeFrame(src, dst net.HardwareAddr, etherType uint16, ls ...gopacket.SerializableLayer) []byte {
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		panic(fmt.Sprintf("pktest: encode frame: %v", err))
	}
	link, err := linkHeader(src, dst, nil, etherType)
	if err != nil {
		panic(fmt.Sprintf("pktest: %v", err))
	}
	return append(link, slices.Clone(buf.Bytes())...)
}
